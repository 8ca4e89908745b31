"""The host tier under TP (issue 36 item 4): every rank demotes its share of a checkpoint to its own host
slots and promotes it back on a hit; rank 0's bookkeeping counts the same host slots on every rank (the
bottleneck rank's slot bytes set the count). Real mpirun ranks on the CPU against the in-process TP1 engine
of the same configuration (tokens and cached tokens equal), with hits served from the host tier on both; and
with host KV (--host-kv-blocks) under a small KV cache, where every rank demotes and warms back its own share
of the same blocks (rank 0's plan) and the KV tier's bookkeeping equals TP1's."""
from __future__ import annotations

import pytest

from tp_helpers import build_tp_model, have_mpi, run_job

import tp_job

pytestmark = pytest.mark.skipif(have_mpi() is not None, reason=str(have_mpi()))


def _reference(model_dir: str, flags: dict) -> dict:
    from trtllm_dasc.engine.engine import Engine
    args = tp_job.parser().parse_args(["--model", model_dir, "--out", "-",
                                       *[x for k, v in flags.items() for x in (f"--{k}", str(v))]])
    return tp_job.job(Engine(tp_job.engine_config(args)))


# one case (the suite's time): KDA with storage balancing, whose checkpoints cross ranks through the
# all-to-all on store and load; the host tier's codecs at TP1 are tests/cache/test_host_tier.py's
# the host-kv case: 24 device KV blocks (a prompt and its decode take up to 19) and 128 host blocks, so the hot
# prompts' prefixes come back from host KV on every rank's heads (each rank mirrors its own share of a block)
HOST_KV = {"kv-blocks": 24, "host-kv-blocks": 128}


# the copy-fault case: rank 1 alone fails to queue its share of the first promotion; the ranks agree on it
# (their failure flags are summed), so rank 0 fails that hit alone and every other request equals TP1's. Dense
# (exact hits): the failed prompt's checkpoints are never stored, so a later request on it hits a shallower one
FAULT = {"copy-fault-rank": 1}


@pytest.mark.parametrize("arch, arm, kv", [("kda", dict(policy="nr", placement="storage", wmax=32), {}),
                                           ("kda", dict(policy="nr", placement="storage", wmax=32), HOST_KV),
                                           ("kda", dict(policy="nr", placement="off", wmax=0), FAULT)],
                         ids=["kda-storage-balanced", "kda-storage-balanced-host-kv", "kda-dense-copy-fault-on-rank-1"])
def test_tp2_host_tier_hits_equal_the_tp1_engine(tmp_path, arch, arm, kv):
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    path = tmp_path / f"tp-{arch}"
    build_tp_model(path, arch, seed=20)
    flags = {"wmax": 16, **arm}

    def slot_bytes(tp):
        plan, _ = plan_from_path(str(path), PlanOptions(wmax=flags["wmax"], tp=tp, placement=arm.get("placement", "off")
                                                        if tp > 1 else "off", codec=arm.get("codec", "native")),
                                 conv_dtype="float32")
        return plan.bottleneck_slot_bytes()

    def sized(tp):
        # three deployable device slots (slot 0 is reserved; the four cold prompts store ~14 checkpoints) and
        # 64 host slots at either degree; one request at a time, so each prompt's captures demote the ones
        # before: the hot prompts' checkpoints are on the host when they come back
        slot = slot_bytes(tp)
        return {**flags, "budget": 4 * slot + slot // 2, "host-cache-bytes": 64 * slot, "max-batch": 1, **kv}
    got = run_job(2, ["--model", str(path), "--tp", "2", *[x for k, v in sized(2).items() for x in (f"--{k}", str(v))]],
                  tmp_path / "out.json")
    ref = _reference(str(path), {k: v for k, v in sized(1).items() if k not in ("placement", "copy-fault-rank")})
    if kv is FAULT:
        # the first hot prompt is the first host hit: its promotion failed on rank 1, so it fails (rank 0's
        # copy went fine: it learns of rank 1's from the summed flags); the rest run as at TP1
        failed, _ = got["hot"].pop(0), ref["hot"].pop(0)
        assert "host tier copy failed (checkpoint promotion" in (failed["error"] or ""), failed
        assert "failed on another TP rank" in failed["error"] and not failed["tokens"], failed
        # the sampled request repeats that prompt: it finds only the checkpoints of the cold prompt below it
        assert got["sampled"][0]["cached"] < ref["sampled"][0]["cached"]
        got["sampled"][0]["cached"] = ref["sampled"][0]["cached"]
    for part in ("cold", "hot", "sampled"):
        assert [g["error"] for g in got[part]] == [None] * len(got[part]), part
        assert [g["tokens"] for g in got[part]] == [r["tokens"] for r in ref[part]], part
        assert [g["cached"] for g in got[part]] == [r["cached"] for r in ref[part]], part
    assert got["checkpoint_hits"]["host"] > 0 and got["checkpoint_promotions"] > 0, got["checkpoint_hits"]
    assert got["checkpoint_hits"] == ref["checkpoint_hits"]
    assert all(r["host_slots"] == got["rank_reports"][0]["host_slots"] > 0 for r in got["rank_reports"])
    # rank 0's bookkeeping moves the same blocks at either degree; host kv was used (warmed back for hits)
    assert got["kv_tier"] == ref["kv_tier"]
    # (with the fault, the failed request's matched tokens go uncounted and its repeat matches less)
    assert kv is FAULT or got["kv_matched_tokens"] == ref["kv_matched_tokens"]
    if kv is HOST_KV:
        assert got["kv_tier"]["warmed_blocks"] > 0 and got["host_kv_blocks"] == kv["host-kv-blocks"], got["kv_tier"]
        # every rank mirrors its own share of each block in host blocks (never more than TP1's whole block)
        assert len(got["rank_reports"]) == 2
        assert all(0 < r["host_kv_bytes"] <= ref["rank_reports"][0]["host_kv_bytes"] for r in got["rank_reports"])
