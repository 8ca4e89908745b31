"""Warm-up runs steps whose checkpoint captures all replay a single token, at batch sizes of Triton's three
classes (engine/warmup.py one_token_capture_prompts says why: on the GPU such a step takes fla's recurrent
kernel, specialised on its batch size, and 12-06's 48B dense server compiled it inside requests).

The replays are restated here from model/recurrence run_recurrence's rule (_from_chunk_states: a capture p
tokens into a sequence, p neither the sequence's length nor a multiple of the chunk, replays p % CHUNK tokens
from the chunk start below it) and read from the captures the model is handed each step; the CPU backend
computes captures another way, so the rule is applied to what the engine asks for, as the GPU would."""
from __future__ import annotations

import pytest

from engine_helpers import SERVED_GEOMETRIES, make_engine, warmup_watching

from trtllm_dasc.model.recurrence.fla import CHUNK


def _one_token_replay_batches(engine) -> set[int]:
    """How many one-token replays each warm-up step made, for the steps whose replays were all one token."""
    found = set()

    def watch(mixer, lin, h, cu, rows, state, cuts, replay, *args, **kw):
        if lin == 0 and cuts:
            spans = [p % CHUNK for i, c in enumerate(cuts) for p in c if p != cu[i + 1] - cu[i] and p % CHUNK]
            if spans and all(n == 1 for n in spans):
                found.add(len(spans))
    warmup_watching(engine, "_linear", watch)
    return found


# the matched-HBM geometry is where the late compile was seen
@pytest.mark.parametrize("geometry", list(SERVED_GEOMETRIES.values()), ids=list(SERVED_GEOMETRIES))
def test_warmup_replays_single_token_captures_at_each_batch_class(tiny_models, geometry):
    engine = make_engine(tiny_models["kda"][0], max_batch=16, block_size=16, num_kv_blocks=4096, **geometry)
    batches = _one_token_replay_batches(engine)
    assert 1 in batches, sorted(batches)
    assert any(n % 16 == 0 for n in batches), sorted(batches)
    assert any(n != 1 and n % 16 for n in batches), sorted(batches)
    assert engine.ready
