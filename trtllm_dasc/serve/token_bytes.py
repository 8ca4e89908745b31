"""A token's raw bytes, for the `bytes` field of OpenAI's chat log probs.

OpenAI's `bytes` exists for tokens that are not whole characters: a client joins the bytes of consecutive
tokens to rebuild text split inside a UTF-8 character. Decoding such a token alone gives U+FFFD, and the
bytes of that ([239, 191, 189]) are not the token's. So a token whose text holds U+FFFD is read from the
vocabulary instead, by the tokenizer's own byte scheme (tokenizer.json's decoder):
- ByteLevel (GPT-2 style BPE): each character of the piece stands for one byte (bytes_to_unicode's map);
- ByteFallback (SentencePiece style): a piece `<0xHH>` is the byte HH.
Every other token is its decoded text's UTF-8, the same text the log prob's `token` field shows.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character ByteLevel writes for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _decoder_types(decoder) -> set[str]:
    """The decoder's step types, Sequence decoders flattened."""
    if not isinstance(decoder, dict):
        return set()
    return {decoder.get("type"), *(t for d in decoder.get("decoders") or [] for t in _decoder_types(d))}


class TokenBytes:
    """token id -> its bytes, for a tokenizers.Tokenizer (TextTokenizer.tok)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        kinds = _decoder_types(json.loads(tokenizer.to_str()).get("decoder"))
        self.byte_level, self.byte_fallback = "ByteLevel" in kinds, "ByteFallback" in kinds
        # added tokens (<|eos|>, ...) are written as they are, never byte-encoded
        self.added = set(tokenizer.get_added_tokens_decoder())

    def __call__(self, token: int, text: str | None = None) -> bytes:
        """``text``: the token decoded alone, when the caller has it (the log prob's `token` field)."""
        if text is None:
            text = self.tok.decode([int(token)], skip_special_tokens=False)
        if "\ufffd" not in text or token in self.added:
            return text.encode("utf-8")
        piece = self.tok.id_to_token(int(token)) or ""
        if self.byte_fallback and _BYTE_PIECE.fullmatch(piece):
            return bytes([int(piece[3:5], 16)])
        if self.byte_level:
            chars = _byte_level_chars()
            if piece and all(c in chars for c in piece):
                return bytes(chars[c] for c in piece)
        # a token that is U+FFFD itself, or a scheme we cannot read back: its text is the best answer
        return text.encode("utf-8")
