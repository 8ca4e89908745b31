"""The committed quality models (benchmarks/quality_models): what the quality issue asks of them, checked
against independent references: transformers' own modeling code must retrieve the needle with them, they
fit the size limit, their decay parameters spread the horizons, and train_meta.json says how they were made."""
from __future__ import annotations

import json
import os

import pytest
import torch

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "quality_models")


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_a_committed_model_is_small_documented_and_spreads_its_horizons(arch):
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    path = os.path.join(MODELS, arch)
    assert os.path.getsize(os.path.join(path, "model.safetensors")) < 8 * 2 ** 20
    meta = json.load(open(os.path.join(path, "train_meta.json")))
    assert meta["config"]["seed"] == 0 and meta["runs"] and all("command" in r for r in meta["runs"])
    kept = []
    for wmax in (16, 64, 128, 512):
        plan, horizons = plan_from_path(path, PlanOptions(wmax=wmax))
        kept.append(sum(map(len, plan.retained)) / sum(len(h) for h in horizons))
    # a spread of horizons: each larger W_max drops more units, and W=512 still keeps some
    assert all(a > b for a, b in zip(kept[1:], kept[2:])) and kept[0] > kept[-1] > 0.0, kept


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_transformers_retrieves_the_needle_with_a_committed_model(arch):
    """Greedy generation by transformers' modeling code (not our engine) on fresh evaluation instances."""
    from transformers import AutoModelForCausalLM

    from trtllm_dasc.evals import tasks as T
    from trtllm_dasc.evals.vocab import TaskVocab
    model = AutoModelForCausalLM.from_pretrained(os.path.join(MODELS, arch), dtype=torch.float32).eval()
    vocab = TaskVocab(model.config.vocab_size)
    right = 0
    for seed in range(4):
        inst = T.make("niah_single_1", 384, seed, vocab)
        ids = torch.tensor([inst.model_input])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=T.answer_tokens(inst), do_sample=False,
                                 eos_token_id=TaskVocab.EOS, pad_token_id=TaskVocab.PAD)
        right += T.score(inst, out[0, ids.shape[1]:].tolist()) == 1.0
    assert right >= 3, f"{arch}: {right} of 4 needles retrieved"
