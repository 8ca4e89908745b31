"""The `bytes` of chat log probs (OpenAI: the token's UTF-8 bytes, so that a client can join consecutive
tokens' bytes into text split inside a character). A byte token (a byte-level BPE piece or a SentencePiece
`<0xHH>` byte-fallback piece) decodes alone to U+FFFD: its bytes were those of U+FFFD ([239, 191, 189]),
so joined they rebuilt replacement characters, not the text. They are now the token's raw bytes; the reference
for byte-level pieces is transformers' bytes_to_unicode (the GPT-2 map). Fails on the old code."""
from __future__ import annotations

import pytest

from test_openai_protocol import engine_dir  # noqa: F401  (an engine directory of the embedded tokenizer)
from trtllm_dasc.serve.openai_frontend import Frontend
from trtllm_dasc.serve.token_bytes import TokenBytes

TEXT = "héllo € 漢字"
REPLACEMENT = list("\ufffd".encode())


def test_byte_level_tokens_give_their_raw_bytes(engine_dir):  # noqa: F811
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    front = Frontend(str(engine_dir), "127.0.0.1:1")
    ids = front.tok.encode(TEXT, add_special_tokens=False)
    pieces = [front.tok.tok.id_to_token(t) for t in ids]
    # the embedded tokenizer splits the non-ASCII characters into byte pieces (what this test is about)
    assert sum("\ufffd" in front.token_text(t) for t in ids) >= 4
    eos, byte_a1 = front.tok.end_id, front.tok.tok.token_to_id("¡")
    content = front.chat_logprobs([(t, -1.0, [(t, -1.0), (byte_a1, -2.0), (eos, -3.0)]) for t in ids])["content"]
    for c, piece in zip(content, pieces):
        assert c["bytes"] == [byte_of[ch] for ch in piece] and c["bytes"] != REPLACEMENT
        # the token field stays the decoded text, as vLLM's
        assert bytes(c["bytes"]).decode(errors="replace") == c["token"]
        assert c["top_logprobs"][0]["bytes"] == c["bytes"]
        # a lone byte 0xA1; a special token's text as it is
        assert c["top_logprobs"][1]["bytes"] == [0xA1] and bytes(c["top_logprobs"][2]["bytes"]) == b"<|eos|>"
    assert b"".join(bytes(c["bytes"]) for c in content).decode() == TEXT


def test_byte_fallback_pieces_give_their_byte():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, normalizers
    # a SentencePiece-style (Llama) tokenizer: characters outside the vocabulary fall back to <0xHH> pieces
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "h": 257, "i": 258, "\u2581": 259}
    tok = tokenizers.Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    enc = tok.encode("hi €")
    assert enc.tokens[-3:] == ["<0xE2>", "<0x82>", "<0xAC>"]
    to_bytes = TokenBytes(tok)
    assert [to_bytes(t) for t in enc.ids[-3:]] == [b"\xe2", b"\x82", b"\xac"]
    assert b"".join(to_bytes(t) for t in enc.ids[-3:]).decode() == "€"
    assert to_bytes(257) == b"h" and to_bytes(vocab["<0x41>"]) == b"A"
