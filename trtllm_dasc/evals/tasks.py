"""RULER-like synthetic long-context tasks over a small token vocabulary, generated deterministically.

Thirteen subtasks after RULER's (Hsieh et al., 2024), rewritten for a model that sees only token ids
(layout in ``vocab.py``; ``k`` a key, ``v`` a value, ``d`` a digit token, ``w`` a word token):

    niah_single_1    noise pattern repeated; one needle  KEY k k VAL d*7 SEP;   QUERY KEY k k ANSWER -> d*7
    niah_single_2    the same on an "essay" haystack (seeded random word sentences ending in DOT)
    niah_single_3    essay; the value is uuid-like: 8 tokens, each a digit or a word
    niah_multikey_1  essay; 4 needles with distinct keys, one queried, the other 3 distract
    niah_multikey_2  the haystack is made entirely of needles (distinct keys and values), one queried
    niah_multikey_3  like multikey_2 with uuid-like keys and values (8 tokens each)
    niah_multivalue  essay; one key, 4 values at different depths;  QUERY ALL KEY k k ANSWER -> the 4 values
                     in prompt order
    niah_multiquery  essay; 4 needles, all queried:  QUERY (KEY k k)*4 ANSWER -> their values in query order
    vt               noise; chains  VAR x0 EQ d*5 SEP,  VAR x1 EQ VAR x0 SEP, ... (2 chains of 5 variables);
                     QUERY VAR EQ d*5 ANSWER -> the 5 variable names of that value's chain, in chain order
    cwe              LIST w ... SEP QUERY COMMON ANSWER -> the 10 common words (each at least twice as
                     frequent as any other word), in order of first appearance
    fwe              LIST w ... SEP QUERY FREQ ANSWER -> the 3 most frequent words of a Zipf(2) list,
                     by count (ties by first appearance); the 3rd is strictly more frequent than the 4th
    qa_1             documents  DOC (s r o SEP)* ;  QUERY s r ANSWER -> o   (one word; r from 8 relations)
    qa_2             two hops:  QUERY s r1 r2 ANSWER -> o2  where  s r1 o1  and  o1 r2 o2  are facts

Every answer is unambiguous: a queried key (or subject-relation pair) occurs exactly once and values
are distinct. Distractors are built to need the whole query: in qa, facts share the asked subject or
relation (and in qa_2 a wrong first hop continues with the asked second relation); in vt a second chain
starts from another value, so listing every variable is wrong.

Prompts hold exactly ``length`` tokens and end with ANSWER; they carry no BOS (``Instance.model_input``
prepends it, as the training mixture does). ``depth`` in [0, 1] is the fraction of the haystack before
the first needle (niah: the queried / first value's needle; vt: the queried chain's first statement;
qa: the document holding the first fact asked about); cwe and fwe have no needle and ignore it.

Scoring of a greedy generation (``score``): generation stops at EOS or after ``len(answer)`` tokens,
so emitting everything never helps.
    exact   niah_single_*, niah_multikey_*, qa_1, qa_2: 1.0 iff the generation starts with the answer.
    recall  niah_multivalue, niah_multiquery: items are the 4 values (7-token groups); the fraction of
            them found as contiguous runs in the generation, in any order (RULER's string_match_all).
    set     vt (5 names), cwe (10 words), fwe (3 words): items are single tokens; the fraction of them
            present in the generation, in any order.

Seeds: evaluation uses seeds in [0, EVAL_SEED_LIMIT); the training mixture draws seeds at or above it,
so no evaluation instance is ever trained on.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from trtllm_dasc.errors import UserError
from trtllm_dasc.evals.vocab import TaskVocab

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]

EVAL_SEED_LIMIT = 10 ** 6

SCORING = {t: "exact" for t in TASKS} | {"niah_multivalue": "recall", "niah_multiquery": "recall",
                                         "vt": "set", "cwe": "set", "fwe": "set"}
# tokens per scored item of the set / recall tasks
ITEM_SIZE = {"niah_multivalue": 7, "niah_multiquery": 7, "vt": 1, "cwe": 1, "fwe": 1}
ANSWER_LENGTH = {"niah_single_1": 7, "niah_single_2": 7, "niah_single_3": 8, "niah_multikey_1": 7,
                 "niah_multikey_2": 7, "niah_multikey_3": 8, "niah_multivalue": 28, "niah_multiquery": 28,
                 "vt": 5, "cwe": 10, "fwe": 3, "qa_1": 1, "qa_2": 1}
# the shortest prompt that still leaves a real haystack around the needles / enough list and facts
MIN_LENGTH = {"niah_single_1": 64, "niah_single_2": 64, "niah_single_3": 64, "niah_multikey_1": 96,
              "niah_multikey_2": 64, "niah_multikey_3": 128, "niah_multivalue": 96, "niah_multiquery": 128,
              "vt": 128, "cwe": 128, "fwe": 128, "qa_1": 64, "qa_2": 96}

NUMBER_DIGITS = 7       # niah values: 1000000..9999999, as in RULER
UUID_TOKENS = 8
VT_CHAINS, VT_HOPS, VT_DIGITS = 2, 4, 5
CWE_COMMON = 10
FWE_TOP, FWE_ZIPF_ALPHA = 3, 2.0
DEFAULT_VOCAB = TaskVocab()
QA_RELATIONS = 8        # the first 8 word ids act as relations in qa, the other words as entities


@dataclass(frozen=True)
class Instance:
    task: str
    seed: int
    length: int                     # requested prompt length (the prompt has exactly this many tokens)
    prompt: tuple[int, ...]         # ends with ANSWER; no BOS
    answer: tuple[int, ...]         # digits / words only; no EOS
    scoring: str                    # "exact" | "set" | "recall"
    depth: float | None = None      # where the first needle went; None for cwe / fwe

    @property
    def model_input(self) -> tuple[int, ...]:
        """What a model is fed to answer: BOS + prompt, as in training."""
        return (TaskVocab.BOS,) + self.prompt


def make(task: str, length: int, seed: int, vocab: TaskVocab = DEFAULT_VOCAB,
         depth: float | None = None) -> Instance:
    """One instance, a pure function of (task, length, seed, vocab, depth)."""
    _check_arguments(task, length, seed, vocab, depth)
    length, seed = int(length), int(seed)
    rng = np.random.default_rng([TASKS.index(task), length, seed, vocab.vocab_size])
    # drawn even when depth is given, so a depth sweep of one seed keeps the same keys and haystack
    seeded_depth = float(rng.random())
    depth = seeded_depth if depth is None else float(depth)
    builder = _Builder(rng, vocab)
    if task in _NIAH:
        prompt, answer = builder.niah(_NIAH[task], length, depth)
    elif task == "vt":
        prompt, answer = builder.variable_tracking(length, depth)
    elif task == "cwe":
        prompt, answer = builder.common_words(length)
    elif task == "fwe":
        prompt, answer = builder.frequent_words(length)
    else:
        prompt, answer = builder.qa(length, depth, hops=1 if task == "qa_1" else 2)
    assert len(prompt) == length and len(answer) == ANSWER_LENGTH[task], (task, len(prompt), len(answer))
    return Instance(task=task, seed=seed, length=length, prompt=tuple(int(t) for t in prompt),
                    answer=tuple(int(t) for t in answer), scoring=SCORING[task],
                    depth=None if task in ("cwe", "fwe") else depth)


def evaluation_instances(length: int, num_per_task: int, vocab: TaskVocab = DEFAULT_VOCAB,
                         tasks: Sequence[str] = TASKS) -> list[Instance]:
    """The evaluation set at one length: seeds 0..num_per_task-1 of every task, depth from the seed."""
    if not 0 < num_per_task <= EVAL_SEED_LIMIT:
        raise UserError(f"num_per_task must be in [1, {EVAL_SEED_LIMIT}], got {num_per_task}")
    return [make(t, length, s, vocab) for t in tasks for s in range(num_per_task)]


def answer_tokens(instance: Instance) -> int:
    """Tokens a greedy generation must produce to be scored: the answer plus its closing EOS."""
    return len(instance.answer) + 1


def score(instance: Instance, generated: Sequence[int]) -> float:
    """Score in [0, 1] of a generation (the tokens after the prompt); rule per task in the docstring."""
    out = []
    for t in list(generated)[:len(instance.answer)]:
        if int(t) == TaskVocab.EOS:
            break
        out.append(int(t))
    if instance.scoring == "exact":
        return float(tuple(out) == instance.answer)
    size = ITEM_SIZE[instance.task]
    items = [instance.answer[i:i + size] for i in range(0, len(instance.answer), size)]
    runs = {tuple(out[i:i + size]) for i in range(len(out) - size + 1)}
    return sum(item in runs for item in items) / len(items)


def _check_arguments(task, length, seed, vocab, depth) -> None:
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; expected one of: {', '.join(TASKS)}")
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise UserError(f"length must be an integer number of tokens, got {length!r}")
    if length < MIN_LENGTH[task]:
        raise UserError(f"length {length} is too short for task {task!r}: it needs at least "
                        f"{MIN_LENGTH[task]} prompt tokens")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(vocab, TaskVocab):
        raise UserError(f"vocab must be a TaskVocab, got {type(vocab).__name__}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, (int, float))
                              or not 0.0 <= depth <= 1.0):
        raise UserError(f"depth must be a number in [0, 1] or None, got {depth!r}")


@dataclass(frozen=True)
class _NiahSpec:
    haystack: str          # "noise" | "essay" | "needles"
    uuid_keys: bool        # keys of 8 uuid-like tokens instead of 2 words
    uuid_values: bool      # values of 8 uuid-like tokens instead of 7 digits
    needles: int = 1       # needles with distinct keys besides a haystack of needles
    values_per_key: int = 1
    queries: int = 1


_NIAH = {
    "niah_single_1": _NiahSpec("noise", False, False),
    "niah_single_2": _NiahSpec("essay", False, False),
    "niah_single_3": _NiahSpec("essay", False, True),
    "niah_multikey_1": _NiahSpec("essay", False, False, needles=4),
    "niah_multikey_2": _NiahSpec("needles", False, False),
    "niah_multikey_3": _NiahSpec("needles", True, True),
    "niah_multivalue": _NiahSpec("essay", False, False, values_per_key=4),
    "niah_multiquery": _NiahSpec("essay", False, False, needles=4, queries=4),
}


@cache
def _noise_pattern(vocab: TaskVocab) -> tuple[int, ...]:
    """RULER's "The grass is green. The sky is blue. ..." : one fixed sentence for every instance."""
    rng = np.random.default_rng(20240401)
    return (*rng.choice(np.asarray(vocab.words), size=7, replace=False).tolist(), TaskVocab.DOT)


@cache
def _essay_unigram(vocab: TaskVocab) -> tuple[np.ndarray, np.ndarray]:
    """A fixed Zipf-like word distribution, so essays have frequent and rare words as text does."""
    rng = np.random.default_rng(20240402)
    words = rng.permutation(np.asarray(vocab.words))
    weights = 1.0 / (np.arange(len(words)) + 10.0)
    return words, weights / weights.sum()


class _Builder:
    """Draws the pieces of one instance from one generator, in a fixed order."""

    def __init__(self, rng: np.random.Generator, vocab: TaskVocab):
        self.rng, self.vocab = rng, vocab
        self.words = np.asarray(vocab.words)

    # ---- pieces -------------------------------------------------------------------------------------
    def distinct(self, n: int, sample_rows: Callable[[int], np.ndarray], what: str) -> list[tuple[int, ...]]:
        """n distinct token tuples, drawn in batches until enough are new."""
        seen, out = set(), []
        for _ in range(64):
            for row in map(tuple, sample_rows(2 * (n - len(out)) + 8).tolist()):
                if row not in seen:
                    seen.add(row)
                    out.append(row)
                    if len(out) == n:
                        return out
        raise UserError(f"cannot draw {n} distinct {what} from a vocabulary of {self.vocab.vocab_size}; "
                        f"use a larger vocabulary or a shorter length")

    def word_keys(self, m: int) -> np.ndarray:
        return self.rng.choice(self.words, size=(m, 2))

    def numbers(self, m: int, digits: int) -> np.ndarray:
        x = self.rng.integers(10 ** (digits - 1), 10 ** digits, size=m)
        return (x[:, None] // 10 ** np.arange(digits - 1, -1, -1)) % 10 + self.vocab.digit(0)

    def uuids(self, m: int) -> np.ndarray:
        is_digit = self.rng.random((m, UUID_TOKENS)) < 0.5
        digits = self.rng.integers(0, 10, size=(m, UUID_TOKENS)) + self.vocab.digit(0)
        return np.where(is_digit, digits, self.rng.choice(self.words, size=(m, UUID_TOKENS)))

    def noise(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        pattern = _noise_pattern(self.vocab)
        tokens = np.resize(np.asarray(pattern), n)
        return tokens, np.unique(np.r_[np.arange(0, n, len(pattern)), n])

    def essay(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        words, p = _essay_unigram(self.vocab)
        tokens = self.rng.choice(words, size=n, p=p)
        ends = np.cumsum(self.rng.integers(8, 16, size=n // 8 + 1)) - 1
        ends = ends[ends < n]
        tokens[ends] = TaskVocab.DOT
        return tokens, np.unique(np.r_[0, ends + 1, n])

    @staticmethod
    def insert(haystack: tuple[np.ndarray, np.ndarray], inserts: list[tuple[float, Sequence[int]]]) -> list[int]:
        """Each insert at the haystack boundary nearest its depth; equal depths keep the list's order."""
        tokens, boundaries = haystack
        out, done = [], 0
        for d, piece in sorted(inserts, key=lambda x: x[0]):
            at = int(boundaries[np.argmin(np.abs(boundaries - d * len(tokens)))])
            out += tokens[done:at].tolist()
            out += [int(t) for t in piece]
            done = at
        return out + tokens[done:].tolist()

    # ---- tasks --------------------------------------------------------------------------------------
    def niah(self, spec: _NiahSpec, length: int, depth: float):
        V = TaskVocab
        key_len = UUID_TOKENS if spec.uuid_keys else 2
        value_len = UUID_TOKENS if spec.uuid_values else NUMBER_DIGITS
        needle_len = key_len + value_len + 3
        num_gold = spec.needles * spec.values_per_key
        query_len = 4 + key_len if spec.values_per_key > 1 else 2 + spec.queries * (1 + key_len)
        room = length - query_len - num_gold * needle_len
        extra = room // needle_len if spec.haystack == "needles" else 0

        keys = self.distinct(spec.needles + extra,
                             self.uuids if spec.uuid_keys else self.word_keys, "keys")
        values = self.distinct(num_gold + extra,
                               self.uuids if spec.uuid_values else lambda m: self.numbers(m, NUMBER_DIGITS),
                               "values")
        gold = [(keys[i // spec.values_per_key], values[i]) for i in range(num_gold)]
        queried = self.rng.permutation(spec.needles)[:spec.queries].tolist()
        other_depths = self.rng.random(num_gold).tolist()
        first = 0 if spec.values_per_key > 1 else queried[0]
        depths = [depth if i == first else other_depths[i] for i in range(num_gold)]

        def needle(k, v):
            return (V.KEY, *k, V.VAL, *v, V.SEP)

        if spec.haystack == "needles":
            preamble = self.rng.choice(self.words, size=room - extra * needle_len)
            distractors = [needle(k, v) for k, v in zip(keys[spec.needles:], values[num_gold:])]
            tokens = np.concatenate([preamble, np.asarray(distractors, dtype=np.int64).reshape(-1)])
            haystack = tokens, len(preamble) + needle_len * np.arange(extra + 1)
        else:
            haystack = self.noise(room) if spec.haystack == "noise" else self.essay(room)
        body = self.insert(haystack, [(d, needle(k, v)) for d, (k, v) in zip(depths, gold)])

        if spec.values_per_key > 1:
            query = (V.QUERY, V.ALL, V.KEY, *keys[0], V.ANSWER)
            answer = [t for d, (_, v) in sorted(zip(depths, gold), key=lambda x: x[0]) for t in v]
        else:
            query = (V.QUERY, *[t for i in queried for t in (V.KEY, *keys[i])], V.ANSWER)
            answer = [t for i in queried for t in values[i]]
        return body + list(query), answer

    def variable_tracking(self, length: int, depth: float):
        V = TaskVocab
        names = self.rng.choice(self.words, size=VT_CHAINS * (VT_HOPS + 1), replace=False).reshape(VT_CHAINS, -1)
        values = self.distinct(VT_CHAINS, lambda m: self.numbers(m, VT_DIGITS), "vt values")
        inserts = []
        for c in range(VT_CHAINS):
            start = float(self.rng.random())
            start = depth if c == 0 else start
            # a link follows the statement it refers to, as assignments do in a program
            links = start + np.sort(self.rng.random(VT_HOPS)) * (1.0 - start)
            inserts.append((start, (V.VAR, names[c, 0], V.EQ, *values[c], V.SEP)))
            inserts += [(float(links[h - 1]), (V.VAR, names[c, h], V.EQ, V.VAR, names[c, h - 1], V.SEP))
                        for h in range(1, VT_HOPS + 1)]
        query = (V.QUERY, V.VAR, V.EQ, *values[0], V.ANSWER)
        room = length - len(query) - sum(len(p) for _, p in inserts)
        return self.insert(self.noise(room), inserts) + list(query), names[0].tolist()

    def common_words(self, length: int):
        V = TaskVocab
        n = length - 5                                  # LIST ... SEP QUERY COMMON ANSWER
        pool = self.vocab.num_words - CWE_COMMON
        # common words at least twice as frequent as any other: with few words the rare ones must
        # repeat more, so the common count grows until the gap holds
        common = max(3, n // (4 * CWE_COMMON))
        while True:
            rest = n - CWE_COMMON * common
            if rest < 1:
                raise UserError(f"cwe cannot fit {CWE_COMMON} common words into {length} tokens with a "
                                f"vocabulary of {self.vocab.vocab_size}")
            rare = min(pool, math.ceil(rest / 1.5))      # about 1.5 occurrences each where words allow
            rare_max = max(2, math.ceil(2 * rest / rare))
            if common >= 2 * rare_max:
                break
            common += 1
        chosen = self.rng.choice(self.words, size=CWE_COMMON + rare, replace=False)
        extra_slots = np.repeat(np.arange(rare), rare_max - 1)
        picked = self.rng.choice(len(extra_slots), size=rest - rare, replace=False)
        rare_counts = 1 + np.bincount(extra_slots[picked], minlength=rare)
        items = np.r_[np.repeat(chosen[:CWE_COMMON], common), np.repeat(chosen[CWE_COMMON:], rare_counts)]
        items = self.rng.permutation(items)
        first_seen = {int(w): i for i, w in reversed(list(enumerate(items)))}
        answer = sorted(chosen[:CWE_COMMON].tolist(), key=first_seen.__getitem__)
        return [V.LIST, *items.tolist(), V.SEP, V.QUERY, V.COMMON, V.ANSWER], answer

    def frequent_words(self, length: int):
        V = TaskVocab
        n = length - 5                                  # LIST ... SEP QUERY FREQ ANSWER
        ranked = self.rng.permutation(self.words)
        p = 1.0 / np.arange(1, len(ranked) + 1) ** FWE_ZIPF_ALPHA
        for _ in range(1000):
            items = ranked[self.rng.choice(len(ranked), size=n, p=p / p.sum())]
            words, first, counts = np.unique(items, return_index=True, return_counts=True)
            order = np.lexsort((first, -counts))
            if len(order) > FWE_TOP and counts[order[FWE_TOP - 1]] > counts[order[FWE_TOP]]:
                return ([V.LIST, *items.tolist(), V.SEP, V.QUERY, V.FREQ, V.ANSWER],
                        words[order[:FWE_TOP]].tolist())
        raise RuntimeError(f"fwe found no list of {n} words with a unique top {FWE_TOP}")  # pragma: no cover

    def qa(self, length: int, depth: float, hops: int):
        V = TaskVocab
        relations, entities = self.words[:QA_RELATIONS], self.words[QA_RELATIONS:]
        rng = self.rng
        query_len = 3 + hops
        remaining, doc_sizes = length - query_len, []
        while remaining >= 5:                           # DOC + at least one fact of 4 tokens
            facts = min(int(rng.integers(3, 7)), (remaining - 1) // 4)
            doc_sizes.append(facts)
            remaining -= 1 + 4 * facts
        preamble = rng.choice(self.words, size=remaining).tolist()

        s, mid, o = rng.choice(entities, size=3, replace=False).tolist()
        r1, r2 = rng.choice(relations, size=2).tolist()
        gold = [(s, r1, mid)] if hops == 1 else [(s, r1, mid), (mid, r2, o)]
        gold_pairs = {(f[0], f[1]) for f in gold}

        def fact(subject=None, relation=None, not_subject=None, not_relation=None):
            """A random fact whose (subject, relation) is never an asked one; callers never fix both
            parts of an asked pair."""
            while True:
                fs = subject if subject is not None else int(rng.choice(entities))
                fr = relation if relation is not None else int(rng.choice(relations))
                if (fs, fr) not in gold_pairs and fs != not_subject and fr != not_relation:
                    return fs, fr, int(rng.choice(entities))

        # facts that share a subject or a relation with an asked one, so matching one part is not enough
        hard = []
        for gs, gr, _ in gold:
            hard += [fact(subject=gs, not_relation=gr), fact(relation=gr, not_subject=gs)]
        if hops == 2:                                   # a wrong first hop that a second hop continues
            wrong = fact(subject=s, not_relation=r1)
            hard.append(wrong)
            if (wrong[2], r2) not in gold_pairs:
                hard.append(fact(subject=wrong[2], relation=r2))

        starts = np.r_[0, np.cumsum(doc_sizes)[:-1]]
        gold_doc = int(round(depth * (len(doc_sizes) - 1)))
        slots = [int(starts[gold_doc]) + int(rng.integers(doc_sizes[gold_doc]))]
        if hops == 2:                                   # the second fact in another document
            others = [d for d in range(len(doc_sizes)) if d != gold_doc] or [gold_doc]
            d = others[int(rng.integers(len(others)))]
            free = [i for i in range(starts[d], starts[d] + doc_sizes[d]) if i != slots[0]]
            slots.append(free[int(rng.integers(len(free)))])
        facts: list = [None] * int(sum(doc_sizes))
        for i, f in zip(slots, gold):
            facts[i] = f
        free = rng.permutation([i for i in range(len(facts)) if facts[i] is None]).tolist()
        for i, f in zip(free, hard):
            facts[i] = f
        facts = [f if f is not None else fact() for f in facts]

        body = preamble
        for d, size in enumerate(doc_sizes):
            body.append(V.DOC)
            for f in facts[starts[d]:starts[d] + size]:
                body += [*f, V.SEP]
        query = [V.QUERY, s, r1, V.ANSWER] if hops == 1 else [V.QUERY, s, r1, r2, V.ANSWER]
        return body + query, [gold[-1][2]]
