"""Warm-up reaches both autotune buckets of fla's row-tiled norms on the prefill path, at the geometry of the
served 48B engines (engine/warmup.py round_lengths says why).

model/fused_ops.py pins the bucket of fla's norm kernels to two: steps of at most PINNED_ROWS rows and
above. fla autotunes each bucket (nine configs) on its first call, so each must be met in warm-up by a step
that takes the norm: MLA's latent norm runs unless every sequence of the step brings at most
PAGED_MAX_TOKENS tokens (then the paged path norms inside its own kernel). With the matched-HBM engines'
long checkpoint interval (2,801 tokens, context 2,816, chunks of 8,192), warm-up's prompts were all ~2.7k
tokens and no such step had 2,048 rows or fewer: on the H200 the first user's request to run in one paid
for the autotune, 27 s. The steps are read from the model's forward calls (the token count of each
sequence) and classified by the rule the model applies on a GPU (on the CPU it never takes the paged path,
so the rule is restated here from the two constants)."""
from __future__ import annotations

import pytest

from engine_helpers import SERVED_GEOMETRIES, make_engine, warmup_watching

from trtllm_dasc.model.fused_ops import PINNED_ROWS
from trtllm_dasc.model.model import PAGED_MAX_TOKENS


def _warmup_steps(engine) -> list[list[int]]:
    """Each forward of warm-up as the token counts of its sequences."""
    steps = []
    warmup_watching(engine, "forward", lambda batch, *args, **kw: steps.append([len(s.token_ids) for s in batch]))
    return steps


@pytest.mark.parametrize("geometry", list(SERVED_GEOMETRIES.values()), ids=list(SERVED_GEOMETRIES))
def test_warmup_runs_unpaged_prefill_steps_in_both_norm_buckets(tiny_models, geometry):
    engine = make_engine(tiny_models["kda"][0], max_batch=4, block_size=16, num_kv_blocks=2048, **geometry)
    steps = _warmup_steps(engine)
    unpaged = [sum(s) for s in steps if any(n > PAGED_MAX_TOKENS for n in s)]
    assert any(rows <= PINNED_ROWS for rows in unpaged), \
        f"no unpaged step of at most {PINNED_ROWS} rows in warm-up: {sorted(set(unpaged))}"
    assert any(rows > PINNED_ROWS for rows in unpaged), sorted(set(unpaged))
    assert engine.ready
