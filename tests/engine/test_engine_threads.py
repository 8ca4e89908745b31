"""The serving loop under concurrency (tests/engine/thread_scenario.py): 8 submitter threads, 500 mixed
requests (shared prefixes, some aborted mid-stream, some malformed), the loop on its own thread, against
transformers' greedy generate. The same scenario runs at TP 2 and 4 on MPI ranks in tests/tp."""
import torch

from engine_helpers import VOCAB, make_engine
from thread_scenario import ENGINE, run_scenario, scenario_prompts


def hf_generate(hf, prompt, n):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        # an explicit mask: generate would otherwise take prompt tokens equal to pad_token_id for padding
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_threads_submit_abort_and_malformed(tiny_models):
    path, hf = tiny_models["kda"]
    reference = {p: hf_generate(hf, list(p), 4) for p in scenario_prompts(VOCAB)}
    run_scenario(make_engine(path, **ENGINE), reference, VOCAB)
