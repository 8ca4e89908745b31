"""The host tier's Prometheus series read the cache manager's counters (names follow dasc_*), and the same
series come out of the real tritonserver's metrics port with the bytes and counts the scenario implies."""
import pytest

from hybrid_tiny import VOCAB

from trtllm_dasc.cache import CacheManager
from trtllm_dasc.serve.metrics import FAMILIES, LABELLED

READ = {name: read for name, _, _, read in FAMILIES} | {name: read for name, _, _, _, read in LABELLED}


def run(m, prompt):
    lease = m.admit(prompt, len(prompt))
    caps = m.extend(lease, lease.match.ckpt_len, len(prompt))
    m.take_copies()
    m.store(lease, caps, [True] * len(caps))
    m.insert(lease, prompt)
    m.release(lease)


def test_tier_series():
    # one device slot of 100 B, two host slots: A is demoted by B, then promoted by A's repeat (demoting B)
    m = CacheManager.create(4, 64, 1, 2, interval=100, prompt_only=True, host_slots=2, slot_bytes=100)
    a, b = [1, 2, 3, 4, 5], [6, 7, 8, 9]
    run(m, a)
    run(m, b)
    run(m, a[:4] + [0, 0])
    s = m.stats()
    assert READ["dasc_checkpoint_promotions_total"](s) == 1
    # A for B, B for A's promotion; the repeat's own checkpoint at 5 finds the one slot locked (by A's
    # hit) and goes uncached: A stays in both tiers, B on the host
    assert READ["dasc_checkpoint_demotions_total"](s) == 2
    assert READ["dasc_checkpoint_hits_total"](s) == {"device": 0, "host": 1}
    assert READ["dasc_checkpoint_hit_tokens_total"](s) == {"device": 0, "host": 4}
    assert READ["dasc_checkpoint_bytes"](s) == {"device": 100, "host": 200}
    assert READ["dasc_host_checkpoint_slots"](s) == {"free": 0, "used": 2}


def test_tier_series_are_zero_with_the_tier_off():
    m = CacheManager.create(4, 64, 1, 2, interval=100, prompt_only=True)
    run(m, [1, 2, 3])
    run(m, [4, 5, 6])
    s = m.stats()
    assert READ["dasc_checkpoint_demotions_total"](s) == READ["dasc_checkpoint_promotions_total"](s) == 0
    assert READ["dasc_host_checkpoint_slots"](s) == {"free": 0, "used": 0}
    assert READ["dasc_checkpoint_bytes"](s) == {"device": 1, "host": 0}


# ---- through the real tritonserver's metrics port ------------------------------------------------------
# gdn tiny: two full-attention layers, one KV head of 24, block 4, float32: k and v per layer
KV_BLOCK_BYTES = 2 * 2 * 4 * 1 * 24 * 4
PROMPTS = [[(7 * k + 3 * i + 1) % VOCAB for i in range(13)] for k in range(4)]


@pytest.fixture(scope="module")
def tier_server(tmp_path_factory):
    from serve_helpers import build, build_engine, serve
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    tmp = tmp_path_factory.mktemp("serve-metrics-tiers")
    build(tmp / "ckpt", "gdn", seed=21)
    plan, _ = plan_from_path(str(tmp / "ckpt"), PlanOptions(wmax=0, tp=1, placement="off"), conv_dtype="float32")
    slot = plan.bottleneck_slot_bytes()
    # two device checkpoint slots (slot 0 is reserved), eight host ones; ten KV blocks, 32 host KV blocks
    engine = build_engine(tmp / "ckpt", tmp / "engine", "--wmax", 0, "--prompt-only", "--max-batch-size", 1,
                          "--state-budget-bytes", 3 * slot, "--host-cache-bytes", 8 * slot, "--kv-blocks", 10,
                          "--host-kv-blocks", 32, "--block-size", 4, "--interval", 8, "--max-context", 32)
    s = serve(engine, tmp / "work")
    yield s, slot
    s.stop()


def test_tier_series_on_the_metrics_port(tier_server):
    from test_metrics import run, scrape, settled
    server, slot = tier_server
    for i, p in enumerate(PROMPTS):
        assert run(server, p, 1, f"p{i}")["error"] is None
    # PROMPTS[0]'s checkpoint (at 12) was demoted by the third prompt and its KV by the later ones
    hit = run(server, PROMPTS[0] + [5, 9], 3, "hit")
    assert hit["error"] is None and hit["cached"] == 12
    hits = ("dasc_checkpoint_hits_total", frozenset({("tier", "host")}))
    m = settled(server, lambda m: m.get(hits, 0) >= 1 and m.get(("dasc_host_tier_copy_seconds_total",
                                                                    frozenset()), 0) > 0)
    get = lambda name, **lab: m[(name, frozenset(lab.items()))]     # noqa: E731
    assert get("dasc_checkpoint_hits_total", tier="host") == 1
    assert get("dasc_checkpoint_hit_tokens_total", tier="host") == 12
    # two slots, five prompt-end checkpoints (the hit stores its own): three demotions before the hit's
    # promotion needs a slot, one for the hit's store; write-back: each demotion is one copy, none at store
    assert get("dasc_checkpoint_tier_copies_total", kind="demotion") == 4
    assert get("dasc_checkpoint_tier_copies_total", kind="write_through") == 0
    assert get("dasc_checkpoint_tier_copies_total", kind="promotion") == 1
    assert get("dasc_host_evictions_total", kind="checkpoints") == 0
    # the hit warmed its 12 tokens' three blocks back from the host
    demoted = get("dasc_kv_tier_blocks_total", kind="demoted")
    assert demoted >= 3 and get("dasc_kv_tier_blocks_total", kind="warmed") == 3
    assert get("dasc_kv_tier_nodes_total", kind="warmed") == 1
    assert get("dasc_host_kv_blocks", state="used") + get("dasc_host_kv_blocks", state="free") == 32
    # bytes: a checkpoint slot as the planner sizes it, a KV block from the model's shapes
    assert get("dasc_host_tier_copy_bytes_total", direction="to_host") == 4 * slot + demoted * KV_BLOCK_BYTES
    assert get("dasc_host_tier_copy_bytes_total", direction="to_device") == slot + 3 * KV_BLOCK_BYTES
    assert get("dasc_host_tier_copy_seconds_total") > 0
    assert get("dasc_checkpoint_bytes", tier="host") == 8 * slot - get("dasc_host_checkpoint_slots",
                                                                       state="free") * slot
