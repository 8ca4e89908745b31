"""Text <-> token ids for the preprocessing / postprocessing models, and the template values they take.

The Triton models load a tokenizer directory the way TensorRT-LLM's do (``tokenizer_dir``), but through the
`tokenizers` library alone: tokenizer.json holds the whole pipeline (normalizer, pre-tokenizer, model,
post-processor adding BOS, decoder), so the server never imports transformers (seconds of start-up and
memory per model instance) and encodes exactly what ``AutoTokenizer.from_pretrained(dir)`` encodes.
Special tokens come from tokenizer_config.json / special_tokens_map.json, else config.json.

No torch and no triton_python_backend_utils here: model_repo's model.py files import this module.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from trtllm_dasc.errors import UserError

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
# the embedded default model (scripts/make_default_model.py); its tokenizer lies next to the weights
DEFAULT_MODEL_DIR = os.path.join(ASSETS, "tiny-kimi-linear")
DEFAULT_CORE_MODEL = "tensorrt_llm"

# the ${...} variables of each model_repo/<name>/config.pbtxt (a test keeps these equal to the files).
# max_batch_size is the core model's variable too: an ensemble's max_batch_size must not exceed any step's.
TEMPLATE_VARIABLES = {
    "preprocessing": ("max_batch_size", "tokenizer_dir", "add_special_tokens", "preprocessing_instance_count"),
    "postprocessing": ("max_batch_size", "tokenizer_dir", "skip_special_tokens", "postprocessing_instance_count"),
    "ensemble": ("max_batch_size", "core_model", "decoupled_mode"),
}

_TRUE, _FALSE = ("true", "1", "t", "y", "yes"), ("false", "0", "f", "n", "no")


def parse_bool(value: str, name: str) -> bool:
    v = str(value).strip().lower()
    if v not in _TRUE + _FALSE:
        raise UserError(f"parameter {name} must be true or false, got {value!r}")
    return v in _TRUE


def model_parameter(model_config: dict, key: str) -> str:
    """A string parameter of a Triton model config (the JSON a Python model's initialize receives)."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value")
    if value is None or value.startswith("${"):
        raise UserError(f"model {model_config.get('name')!r}: parameter {key} is not set in config.pbtxt "
                        "(fill the template with trtllm_dasc.serve.tokenizer.text_model_values)")
    return value


def text_model_values(tokenizer_dir: str = DEFAULT_MODEL_DIR, *, max_batch_size: int = 8,
                      core_model: str = DEFAULT_CORE_MODEL, add_special_tokens: bool = True,
                      skip_special_tokens: bool = True, instance_count: int = 1,
                      written_as: str | None = None, decoupled: bool = True) -> dict[str, dict]:
    """{model name: values for repository.fill_model} for preprocessing, postprocessing and ensemble.
    ``written_as``: the tokenizer_dir config.pbtxt gets (dasc-build: "../../model", relative to each model's
    directory) instead of tokenizer_dir's absolute path; only the path written is held to config.pbtxt's
    quoting (an engine directory named with a quote was refused for the temporary path it never writes).
    ``decoupled``: the ensemble's transaction policy (a plain ensemble for plain-infer clients, as TensorRT-LLM's
    platform ensemble is with decoupled_mode false; its core_model must then be a plain model too)."""
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise UserError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
    if isinstance(instance_count, bool) or not isinstance(instance_count, int) or instance_count < 1:
        raise UserError(f"instance_count must be a positive integer, got {instance_count!r}")
    # a Triton model name is also a directory name; quotes would break config.pbtxt
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(core_model)):
        raise UserError(f"core_model must be a Triton model name ([A-Za-z0-9_.-]+), got {core_model!r}")
    tokenizer_dir = os.path.abspath(tokenizer_dir)
    _tokenizer_json(tokenizer_dir)
    tokenizer_dir = written_as if written_as is not None else tokenizer_dir
    if '"' in tokenizer_dir or "\\" in tokenizer_dir:
        raise UserError(f"tokenizer_dir {tokenizer_dir!r}: a path with quotes or backslashes cannot go into "
                        "config.pbtxt")
    shared = {"max_batch_size": max_batch_size, "tokenizer_dir": tokenizer_dir}
    values = {
        "preprocessing": {**shared, "add_special_tokens": str(add_special_tokens).lower(),
                          "preprocessing_instance_count": instance_count},
        "postprocessing": {**shared, "skip_special_tokens": str(skip_special_tokens).lower(),
                           "postprocessing_instance_count": instance_count},
        "ensemble": {"max_batch_size": max_batch_size, "core_model": core_model,
                     "decoupled_mode": str(bool(decoupled)).lower()},
    }
    return {name: {k: v[k] for k in TEMPLATE_VARIABLES[name]} for name, v in values.items()}


def _tokenizer_json(tokenizer_dir: str) -> str:
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise UserError(f"tokenizer_dir {tokenizer_dir}: no tokenizer.json there (the pre/postprocessing "
                        "models need a fast tokenizer: save one with AutoTokenizer(...).save_pretrained(dir))")
    return path


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(entry) -> str | None:
    # tokenizer_config.json writes a token as a string or as an AddedToken dict
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


class TextTokenizer:
    """A tokenizers.Tokenizer with the ids TensorRT-LLM's pre/postprocessing take from a tokenizer:
    ``end_id`` (EOS) and ``pad_id`` (PAD, else EOS, as TensorRT-LLM falls back)."""

    def __init__(self, tokenizer_dir: str):
        from tokenizers import Tokenizer
        path = _tokenizer_json(tokenizer_dir)
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise UserError(f"{path}: not a tokenizers file ({e})") from None
        self.vocab_size = self.tok.get_vocab_size()
        config = {**_read_json(os.path.join(tokenizer_dir, "special_tokens_map.json")),
                  **_read_json(os.path.join(tokenizer_dir, "tokenizer_config.json"))}
        model = _read_json(os.path.join(tokenizer_dir, "config.json"))
        # the model's vocabulary (its config.json: the LM head's rows), which an embedding_bias row must span
        # (TensorRT-LLM's check); the tokenizer's own count when there is none
        vocab = model.get("vocab_size")
        self.model_vocab_size = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 \
            else self.vocab_size
        self.end_id = self._special_id(config, model, "eos", tokenizer_dir)
        pad = self._special_id(config, model, "pad", tokenizer_dir, required=False)
        self.pad_id = self.end_id if pad is None else pad

    def _special_id(self, config: dict, model: dict, kind: str, where: str, required: bool = True):
        text = _token_text(config.get(f"{kind}_token"))
        if text is not None:
            tid = self.tok.token_to_id(text)
            if tid is None:
                raise UserError(f"{where}: {kind}_token {text!r} is not in tokenizer.json's vocabulary")
            return tid
        tid = model.get(f"{kind}_token_id")
        if isinstance(tid, list):     # config.json may list several EOS ids; the first ends generation
            tid = tid[0] if tid else None
        if isinstance(tid, int) and not isinstance(tid, bool):
            return tid
        if required:
            raise UserError(f"{where}: no {kind}_token in tokenizer_config.json and no {kind}_token_id in "
                            "config.json")
        return None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def word_lists(self, rows, batch_size: int, field: str = "words") -> np.ndarray:
        """TensorRT-LLM's stop/bad words format, int32 [batch, 2, N].

        Row b of ``rows`` holds request b's words (str or UTF-8 bytes; a word may be several words, e.g.
        "lorem ipsum"). Each word is encoded without special tokens; a word that encodes to nothing is
        dropped. [b, 0] is the concatenation of the words' ids, [b, 1] the running end offset of each word;
        every row is padded to N = max(1, longest concatenation) with id 0 and offset -1. ``rows`` None
        gives [batch, 2, 0] (no words).
        """
        if rows is None:
            return np.empty((batch_size, 2, 0), dtype=np.int32)
        flat, ends = [], []
        for row in rows:
            ids, offsets = [], []
            for word in np.asarray(row, dtype=object).reshape(-1):
                piece = self.encode(as_text(word, field), add_special_tokens=False)
                if piece:
                    ids += piece
                    offsets.append(len(ids))
            flat.append(ids)
            ends.append(offsets)
        width = max(1, max((len(ids) for ids in flat), default=0))
        out = np.zeros((len(flat), 2, width), dtype=np.int32)
        out[:, 1, :] = -1
        for b, (ids, offsets) in enumerate(zip(flat, ends)):
            out[b, 0, :len(ids)] = ids
            out[b, 1, :len(offsets)] = offsets
        return out


def as_text(value, field: str) -> str:
    """A BYTES tensor element as str; invalid UTF-8 is a UserError naming ``field``."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{field}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    return str(value)
