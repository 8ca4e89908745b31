"""Which text models (preprocessing, postprocessing, ensemble) an engine directory gets, and their values.

They need the checkpoint's own tokenizer (tokenizer.json, read with the `tokenizers` library); a checkpoint
without one is served by dasc_hybrid alone (token ids in, token ids out).
"""
from __future__ import annotations

import os

from trtllm_dasc.serve.repository import TEMPLATES

TEXT_MODELS = ("preprocessing", "postprocessing", "ensemble")


def text_model_values(model_dir: str, core_values: dict) -> dict[str, dict]:
    """{model name: template values} for the text models, or {} without a tokenizer (or templates)."""
    if not os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        return {}
    if not all(os.path.isdir(os.path.join(TEMPLATES, m)) for m in TEXT_MODELS):
        return {}
    return {}
