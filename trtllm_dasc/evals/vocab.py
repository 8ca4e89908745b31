"""Token-id layout of the synthetic long-context tasks: no text and no tokenizer, just integer ids.

    [0, 32)               reserved special tokens (markers of the task grammar; unused ids stay free)
    [32, 42)              the ten digits 0..9
    [42, vocab_size)      "words": opaque content tokens (keys, haystack, list items, entities, ...)

The special ids are fixed whatever the vocabulary size, so a prompt's grammar reads the same in every
vocabulary and a model trained at one size can be probed with the markers at another.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from trtllm_dasc.errors import UserError

# the grammar's markers; ids 16..31 are kept free so new tasks can add markers without moving digits
SPECIAL_NAMES = ("PAD", "BOS", "EOS", "SEP", "KEY", "VAL", "QUERY", "ANSWER",
                 "EQ", "DOC", "VAR", "LIST", "DOT", "ALL", "COMMON", "FREQ")
NUM_RESERVED = 32
NUM_DIGITS = 10
# a vocabulary this small still leaves 86 words: enough distinct keys, entities and list items
MIN_VOCAB_SIZE = 128


@dataclass(frozen=True)
class TaskVocab:
    """The id layout for a model with ``vocab_size`` embedding rows (at least 128)."""
    vocab_size: int = 512

    PAD: ClassVar[int] = 0
    BOS: ClassVar[int] = 1
    EOS: ClassVar[int] = 2
    SEP: ClassVar[int] = 3        # closes a record: a needle, a statement, a fact, a list
    KEY: ClassVar[int] = 4
    VAL: ClassVar[int] = 5
    QUERY: ClassVar[int] = 6
    ANSWER: ClassVar[int] = 7     # the prompt's last token: the answer follows it
    EQ: ClassVar[int] = 8
    DOC: ClassVar[int] = 9
    VAR: ClassVar[int] = 10
    LIST: ClassVar[int] = 11
    DOT: ClassVar[int] = 12       # ends a haystack "sentence"; needles are inserted at sentence boundaries
    ALL: ClassVar[int] = 13       # "every value of this key" (niah_multivalue)
    COMMON: ClassVar[int] = 14    # "the most common words" (cwe)
    FREQ: ClassVar[int] = 15      # "the most frequent words" (fwe)

    def __post_init__(self):
        size = self.vocab_size
        if isinstance(size, bool) or not isinstance(size, int):
            raise UserError(f"vocab_size must be an integer, got {size!r}")
        if size < MIN_VOCAB_SIZE:
            raise UserError(f"vocab_size must be at least {MIN_VOCAB_SIZE} ({NUM_RESERVED} reserved ids, "
                            f"{NUM_DIGITS} digits and enough words), got {size}")

    @property
    def specials(self) -> range:
        return range(NUM_RESERVED)

    @property
    def digits(self) -> range:
        return range(NUM_RESERVED, NUM_RESERVED + NUM_DIGITS)

    @property
    def words(self) -> range:
        return range(NUM_RESERVED + NUM_DIGITS, self.vocab_size)

    @property
    def num_words(self) -> int:
        return len(self.words)

    def digit(self, d: int) -> int:
        """The token of decimal digit ``d``."""
        return NUM_RESERVED + d

    def number_tokens(self, value: int) -> tuple[int, ...]:
        """A non-negative integer written as its decimal digit tokens."""
        return tuple(self.digit(int(c)) for c in str(value))

    def is_special(self, token: int) -> bool:
        return 0 <= token < NUM_RESERVED

    def render(self, tokens: Iterable[int]) -> str:
        """Human-readable form for debugging: markers by name, digits as 0..9, words as w<id>."""
        out = []
        for t in tokens:
            t = int(t)
            if t < len(SPECIAL_NAMES):
                out.append(SPECIAL_NAMES[t])
            elif t < NUM_RESERVED:
                out.append(f"<r{t}>")
            elif t in self.digits:
                out.append(str(t - NUM_RESERVED))
            else:
                out.append(f"w{t}")
        return " ".join(out)
