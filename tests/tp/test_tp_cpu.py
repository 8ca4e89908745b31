"""TP over MPI on CPU ranks (gloo): T = 1, 2, 4, 8 ranks give transformers' logits and the TP1 engine's
tokens and cache hits; every rank's checkpoint pool has the planner's slot bytes for that rank."""
from __future__ import annotations

import sys

import pytest
import torch

from engine_helpers import one_torch_thread
from tp_helpers import build_tp_model, have_mpi, run_batch

import tp_job

pytestmark = pytest.mark.skipif(have_mpi() is not None, reason=f"no MPI here: {have_mpi()}")

# the in-process references (TP1 engine, transformers) on one torch thread; the ranks set their own
_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for i, arch in enumerate(("gdn", "kda")):
        path = tmp_path_factory.mktemp(f"tp-{arch}")
        out[arch] = (str(path), build_tp_model(path, arch, seed=10 + i))
    return out


_REFERENCES: dict = {}


def _reference(model_dir: str, **over) -> dict:
    """The same job on the plain in-process engine (TP1, no MPI); computed once per model and options (the
    tests only read it)."""
    key = (model_dir, tuple(sorted(over.items())))
    if key not in _REFERENCES:
        _REFERENCES[key] = _run_reference(model_dir, **over)
    return _REFERENCES[key]


def _run_reference(model_dir: str, **over) -> dict:
    from trtllm_dasc.engine.engine import Engine
    args = tp_job.parser().parse_args(["--model", model_dir, "--out", "-",
                                       *[x for k, v in over.items() for x in (f"--{k}", str(v))]])
    return tp_job.job(Engine(tp_job.engine_config(args)))


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids)[None]).logits[0].float()


# the cases, run by one mpirun per TP degree (batch_job.py: a rank's start costs more than most cases on a
# 2-core machine). Each case covers what the others do not:
#   gdn TP2: gdn's 2 attention heads split (partial attention, the shared KV head); gdn TP4: they stay whole
#   while the linear layers and MLPs split; kda TP8: the largest degree, one MLA and one linear head a rank.
#   (Folded: TP1 through mpirun, a path no product run takes -- serve and `dasc logits` start ranks only at
#   T > 1 -- whose launch every case here runs; kda TP2 / TP4 and gdn TP8, the same split / all-reduce code
#   as kda TP8 and gdn TP4, kda at TP4 still checked against TP1 by the arms below.)
MATCH_CASES = [("gdn", 2), ("gdn", 4), ("kda", 8)]
ARM_CASES = [
    ("gdn", 4, dict(policy="nr", codec="int8")), ("kda", 4, dict(policy="wr")),
    ("gdn", 2, dict(policy="wr", placement="hybrid")),
    # these move units between ranks (the planner's transfers; counts from plan.moved_units)
    ("kda", 4, dict(policy="nr", placement="storage", wmax=32)),             # 3 units moved
    ("kda", 2, dict(policy="nr", placement="storage", wmax=64, codec="int8")),  # 2
    ("gdn", 4, dict(policy="nr", placement="storage", wmax=32)),             # 2
    ("kda", 8, dict(policy="wr", placement="hybrid", wmax=16)),              # 1
]
STORAGE_CASES = [
    ("kda", 4, 32, "storage", "native"), ("kda", 8, 64, "storage", "int8"), ("gdn", 8, 32, "hybrid", "native"),
    ("kda", 2, 64, "storage", "int8"),
]
# the thread scenario at TP2 (folded: TP4, the same rank-0-drives-the-workers code with two more workers)
THREAD_TPS = [2]


def _flags(flags: dict) -> list[str]:
    return [x for k, v in flags.items() for x in (f"--{k}", str(v))]


def _arm_flags(path: str, arm: dict) -> dict:
    return {"wmax": _split_wmax(path), **arm}


class _Batches:
    """Every case's result, from one mpirun per TP degree, started when a test first needs that degree."""

    def __init__(self, models, tmp_path_factory):
        self.models, self.tmp = models, tmp_path_factory
        self.results: dict = {}

    def tasks(self, tp: int) -> list[tuple[tuple, dict]]:
        out = []
        for arch, t in MATCH_CASES:
            if t == tp:
                out.append((("match", arch), {"kind": "engine", "args": ["--model", self.models[arch][0],
                                                                          "--tp", str(tp)]}))
        for i, (arch, t, arm) in enumerate(ARM_CASES):
            if t == tp:
                path = self.models[arch][0]
                out.append((("arm", i), {"kind": "engine",
                                         "args": ["--model", path, "--tp", str(tp), *_flags(_arm_flags(path, arm))]}))
        for arch, t, wmax, placement, codec in STORAGE_CASES:
            if t == tp:
                out.append((("storage", arch, wmax, placement, codec),
                            {"kind": "storage", "args": ["--model", self.models[arch][0], "--wmax", str(wmax),
                                                         "--placement", placement, "--codec", codec]}))
        if tp in THREAD_TPS:
            out.append((("thread",), {"kind": "thread", "args": self._thread_args(tp)}))
        return out

    def _thread_args(self, tp: int) -> list[str]:
        import json
        from thread_scenario import scenario_prompts
        path, hf = self.models["kda"]
        vocab = hf.config.vocab_size
        ref = []
        for p in scenario_prompts(vocab):
            with torch.no_grad():
                ids = torch.tensor([list(p)])
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)
            ref.append([list(p), out[0, len(p):].tolist()])
        where = self.tmp.mktemp(f"thread-ref-{tp}") / "ref.json"
        where.write_text(json.dumps(ref))
        return ["--model", path, "--tp", str(tp), "--reference", str(where), "--vocab", str(vocab)]

    def get(self, tp: int, key: tuple):
        if tp not in self.results:
            tasks = self.tasks(tp)
            done = run_batch(tp, [t for _, t in tasks], self.tmp.mktemp(f"tp{tp}-batch"))
            self.results[tp] = {k: d for (k, _), d in zip(tasks, done)}
        got = self.results[tp][key]
        if "error" in got:
            raise AssertionError(f"TP{tp} {key} failed on the ranks:\n{got['error']}")
        return got["result"]


@pytest.fixture(scope="module")
def batches(models, tmp_path_factory):
    return _Batches(models, tmp_path_factory)


@pytest.mark.parametrize("arch, tp", MATCH_CASES)
def test_tp_matches_tp1_and_transformers(models, batches, arch, tp):
    path, hf = models[arch]
    got = batches.get(tp, ("match", arch))
    ref = _reference(path)
    cold, _ = tp_job.prompts(hf.config.vocab_size)
    for i, (g, r) in enumerate(zip(got["cold"], ref["cold"])):
        assert g["error"] is None
        logits = torch.tensor(g["logits"])
        want = _hf_logits(hf, cold[i])
        err = (logits - want).abs().max().item()
        assert err <= 1e-4 * want.abs().max().item(), f"prompt {i}: TP{tp} logits off transformers by {err:.2e}"
        assert g["tokens"] == r["tokens"]
    # the extended prompts hit the checkpoints stored at TP ranks (each rank stored and loaded its share)
    assert [g["tokens"] for g in got["hot"]] == [r["tokens"] for r in ref["hot"]]
    assert [g["cached"] for g in got["hot"]] == [r["cached"] for r in ref["hot"]]
    assert all(g["cached"] > 0 for g in got["hot"])
    assert got["sampled"][0]["tokens"] == ref["sampled"][0]["tokens"]
    assert len(got["rank_reports"]) == tp


def _split_wmax(path: str) -> int:
    from engine_helpers import split_wmax
    return split_wmax(path)


@pytest.mark.parametrize("arch, tp, arm", ARM_CASES)
def test_tp_dasc_arms_match_tp1(models, batches, arch, tp, arm):
    """A dasc arm at TP: each rank stores and loads its share of the compressed checkpoint (with storage
    balancing, through the all-to-all); tokens and hits equal the TP1 engine's of the same arm, and every
    rank's slot bytes are the planner's for that rank."""
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    path, _ = models[arch]
    flags = _arm_flags(path, arm)
    wmax = flags["wmax"]
    got = batches.get(tp, ("arm", ARM_CASES.index((arch, tp, arm))))
    ref = _reference(path, **{k: v for k, v in flags.items() if k != "placement"})
    for part in ("cold", "hot", "sampled"):
        assert [g["tokens"] for g in got[part]] == [r["tokens"] for r in ref[part]], part
        assert [g["cached"] for g in got[part]] == [r["cached"] for r in ref[part]], part
    plan, _ = plan_from_path(path, PlanOptions(wmax=wmax, tp=tp, placement=arm.get("placement", "off"),
                                               codec=arm.get("codec", "native")),
                             conv_dtype="float32")   # the engine checkpoints conv state in its own dtype
    assert [r["slot_bytes"] for r in got["rank_reports"]] == plan.slot_bytes_per_rank()
    # the engine's stats: every rank's slot as allocated, and the all-to-all clock where units move
    assert got["slot_bytes_per_rank"] == plan.slot_bytes_per_rank()
    if plan.moved_units:
        ex = got["exchange"]
        assert ex["store"]["ops"] > 0 and ex["load"]["ops"] > 0, ex
        for op in ("store", "load"):
            # payload (and int8 scales) each one collective per op; time measured
            assert ex[op]["calls"] == ex[op]["ops"] * (2 if arm.get("codec") == "int8" else 1), ex
            assert ex[op]["seconds"] > 0 and ex[op]["ms_per_op"] > 0
    else:
        assert got["exchange"] is None


def test_tp_degree_that_does_not_divide_the_heads_is_refused(models):
    """8 heads cannot go to 3 ranks: a head's state rows cannot be split (its output norm spans the whole
    value dim of the head, so a split head would need another all-reduce inside the mixer)."""
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.runner import ModelRunner
    from trtllm_dasc.errors import UserError
    with pytest.raises(UserError, match="TP degree 3 does not divide the 8"):
        ModelRunner(EngineConfig(model=models["kda"][0], tp_size=3), tp_rank=0, all_reduce=lambda t: t)


def test_tp_engine_needs_the_ranks(models):
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.engine import Engine
    from trtllm_dasc.errors import UserError
    with pytest.raises(UserError, match="MPI ranks"):
        Engine(EngineConfig(model=models["gdn"][0], tp_size=2))


@pytest.mark.parametrize("arch, tp, wmax, placement, codec", STORAGE_CASES)
def test_storage_all_to_all_round_trip_is_bit_exact(batches, arch, tp, wmax, placement, codec):
    """Checkpoints survive the store all-to-all and the load all-to-all bit for bit: every rank's loaded
    rows equal those of its own unbalanced pool (all units at home), and units really moved."""
    got = batches.get(tp, ("storage", arch, wmax, placement, codec))
    ranks = got["ranks"]
    assert got["moved_units"] > 0 and sum(r["sent"] for r in ranks) == got["moved_units"]
    assert sum(r["received"] for r in ranks) == got["moved_units"]
    for r in ranks:
        assert r["temporal_equal"] and r["conv_equal"] and r["loaded_rows_nonzero"], r
        # the all-to-all clock: one store and one load, a collective per encoded tensor each, and the bytes
        # a rank sent are its moved units' encodings (store: the units it sends; load: those it gives back)
        ex, per_unit = r["exchange"], r["unit_bytes"] * 3            # three slots stored and loaded
        calls = 2 if codec == "int8" else 1
        assert ex["store"]["ops"] == ex["load"]["ops"] == 1 and ex["store"]["calls"] == ex["load"]["calls"] == calls
        assert ex["store"]["bytes_sent"] == r["sent"] * per_unit
        assert ex["load"]["bytes_sent"] == r["received"] * per_unit
    assert [r["slot_bytes"] for r in ranks] == got["planner_slot_bytes"]


def test_attention_and_mlp_are_split_where_the_degree_divides(models):
    """What a rank holds: kda at TP8 has 1 of 8 MLA heads and 1/8 of every MLP/expert's channels; gdn's 2
    attention heads split at TP2 (the one KV head shared) and stay whole at TP4 (no all-reduce for them)."""
    from trtllm_dasc.model import HybridModel
    kda = HybridModel.from_pretrained(models["kda"][0], tp_rank=3, tp_size=8)
    for mixer, mlp, *_ in kda.layers:
        if mixer.kind == "mla":
            assert mixer.partial and mixer.H == 1 and mixer.w["o_proj"].shape[1] == kda.spec.v_head_dim
        gate = mlp.gate if hasattr(mlp, "gate") else mlp.w["gate"]
        assert mlp.partial and gate.shape[-2] in (kda.spec.intermediate_size // 8, kda.spec.moe_intermediate_size // 8)
    for tp, split in ((2, True), (4, False)):
        gdn = HybridModel.from_pretrained(models["gdn"][0], tp_rank=1, tp_size=tp)
        att = [m for m, *_ in gdn.layers if m.kind == "gqa"]
        assert all(a.partial == split and a.H == (1 if split else 2) and a.Hk == 1 for a in att)
        assert gdn.kv_token_shapes == [(1, gdn.spec.head_dim)] * 2


def _cli(*args, timeout=300):
    import subprocess
    return subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_dasc_logits_tp_equals_transformers(models, tmp_path):
    """`dasc logits --tp 4` starts its own mpirun; the split run (store at K through the storage
    all-to-all, load, continue) at W_max 0 equals transformers' logits. (One launch: the unsplit --tp run
    went through the same relaunch and rank-0 report, its context logits at TP are the engine cases'.)"""
    import numpy as np
    path, hf = models["kda"]
    ids = [5, 9, 11, 3, 40, 41, 7, 8, 90, 12, 13, 60]
    want = _hf_logits(hf, ids).numpy()
    split = tmp_path / "split.npy"
    r = _cli("logits", "--model", path, "--ids", ",".join(map(str, ids)), "--out", str(split), "--tp", "4",
             "--split", "5", "--placement", "storage")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("wrote") == 1        # rank 0 alone reports
    assert np.abs(np.load(split) - want).max() <= 1e-4 * np.abs(want).max()


def test_dasc_logits_tp_bad_degree_is_one_line(models, tmp_path):
    r = _cli("logits", "--model", models["kda"][0], "--ids", "1,2,3", "--out", str(tmp_path / "x.npy"), "--tp", "3")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["dasc logits: error: TP degree 3 does not divide the 8 "
                                             "linear-attention heads"]


@pytest.mark.parametrize("tp", THREAD_TPS)
def test_engine_thread_scenario_at_tp(batches, tp):
    """The engine-seam thread test (500 requests from 8 threads, aborts, malformed ones, tiny pools that
    evict all the time) with rank 0's engine driving T ranks: transformers' tokens, everything freed."""
    stats = batches.get(tp, ("thread",))
    assert stats["hit_rate"] > 0.2 and stats["dead"] is None


def test_ranks_keep_our_search_paths_under_an_absolute_path_mpirun(tmp_path):
    """mpirun run by its absolute path prepends its own bin/lib to the ranks' PATH and LD_LIBRARY_PATH (as
    if given --prefix); with a system Open MPI that put /usr/bin/python3 (no numpy) in front of the Triton
    stub on the H200. The launch pins both, so a rank sees exactly the launcher's paths."""
    import os
    import shutil
    import subprocess

    from trtllm_dasc.parallel.launch import MPIRUN_FLAGS, find_mpirun, mpi_environment, pinned_paths
    env = mpi_environment(1, dict(os.environ, PATH=os.pathsep.join([str(tmp_path), os.environ["PATH"]]),
                                  LD_LIBRARY_PATH=str(tmp_path)))
    probe = [sys.executable, "-c", "import os; print('PATH=' + os.environ['PATH']); "
             "print('LD=' + os.environ['LD_LIBRARY_PATH'])"]
    runs = {}
    for name, mpirun in (("ours", find_mpirun()), ("system", shutil.which("mpirun", path="/usr/bin:/bin"))):
        if mpirun is None or not os.path.isabs(mpirun):
            continue
        out = subprocess.run([mpirun, *MPIRUN_FLAGS, "-np", "1", *pinned_paths(env), *probe], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        runs[name] = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert runs, "no mpirun to run"
    for name, seen in runs.items():
        assert seen["PATH"] == env["PATH"], f"{name}: {seen['PATH'][:200]}"
        assert seen["LD"] == str(tmp_path), f"{name}: {seen['LD']}"
