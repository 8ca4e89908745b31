"""The quality protocol through the real engine (warm -> replay that must load a checkpoint), its
statistics, and the training script's CPU smoke run."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trtllm_dasc.evals.protocol import ProtocolConfig, parse_arm, run_arm
from trtllm_dasc.evals.report import accuracy_table, comparisons, format_comparisons
from trtllm_dasc.evals.train import TrainConfig, build_model, train

TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=384, tokens_per_step=768, warmup_steps=1)


@pytest.fixture(scope="module")
def kda_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("evals-kda")
    train(TrainConfig(arch="kda", **TINY), str(path), minutes=2, device="cpu", max_steps=2, log=lambda m: None)
    return str(path)


def test_training_writes_a_checkpoint_our_engine_plans_and_loads(kda_model, tmp_path):
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    meta = json.loads(open(f"{kda_model}/train_meta.json").read())
    assert meta["steps"] == 2 and all(np.isfinite(c[2]) for c in meta["loss_curve"])
    HybridModel.from_pretrained(kda_model)
    plan, horizons = plan_from_path(kda_model, PlanOptions(wmax=16))
    kept = sum(map(len, plan.retained)) / sum(len(h) for h in horizons)
    assert 0.0 < kept < 1.0, "the paper's decay profile spreads the horizons around W=16"
    # gdn builds too (3:1 layers, dense MLP)
    gdn = build_model(TrainConfig(arch="gdn", **TINY))
    assert gdn.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]


def test_dense_replays_equal_transformers_greedy_and_are_scored(kda_model):
    from transformers import AutoModelForCausalLM

    from trtllm_dasc.evals import tasks as T
    from trtllm_dasc.evals.vocab import TaskVocab
    cfg = ProtocolConfig(tasks=("niah_single_2", "cwe"), lengths=(200,), instances=3, max_batch=3)
    out = run_arm(kda_model, parse_arm("dense"), cfg)
    assert out["misses"] == []
    hf = AutoModelForCausalLM.from_pretrained(kda_model, dtype=torch.float32).eval()
    for task in cfg.tasks:
        for seed in range(3):
            inst = T.make(task, 200, seed, TaskVocab(256))
            ids = list(inst.model_input)
            with torch.no_grad():
                for _ in range(T.answer_tokens(inst)):
                    ids.append(int(hf(torch.tensor(ids)[None]).logits[0, -1].argmax()))
            rec = out["scores"][task]["200"][str(seed)]
            assert rec["score"] == T.score(inst, ids[len(inst.model_input):])
            assert rec["cached"] == rec["prompt"] - 1          # the prompt-end checkpoint was loaded


def test_a_replay_that_misses_is_reported_and_not_scored(kda_model):
    cfg = ProtocolConfig(tasks=("vt",), lengths=(200,), instances=2, max_batch=2, warm=False)
    out = run_arm(kda_model, parse_arm("nr16+int8"), cfg)
    assert out["scores"]["vt"]["200"] == {} and sorted(out["misses"]) == [["vt", 200, 0], ["vt", 200, 1]]


def test_replay_rounds_are_averaged_per_instance_and_a_missed_round_is_left_out(kda_model):
    """The paper's three measured rounds: each instance keeps its round scores and is scored by their mean; with no
    warm pass the first round misses (it stores the checkpoint the later rounds load), so it is listed per round and
    the instance is scored from the other two."""
    cfg = ProtocolConfig(tasks=("niah_single_2",), lengths=(200,), instances=2, max_batch=2, warm=False, rounds=3)
    out = run_arm(kda_model, parse_arm("dense"), cfg)
    assert out["misses"] == [] and sorted(out["round_misses"]) == [["niah_single_2", 200, 0, 0], ["niah_single_2", 200, 1, 0]]
    one = run_arm(kda_model, parse_arm("dense"), ProtocolConfig(tasks=("niah_single_2",), lengths=(200,), instances=2,
                                                                max_batch=2))
    for seed in ("0", "1"):
        rec = out["scores"]["niah_single_2"]["200"][seed]
        assert len(rec["rounds"]) == 2 and rec["score"] == sum(rec["rounds"]) / 2
        # greedy replays of the same loaded checkpoint: every round scores what a single round scores
        assert rec["rounds"] == [one["scores"]["niah_single_2"]["200"][seed]["score"]] * 2
    with pytest.raises(ValueError, match="rounds"):
        ProtocolConfig(tasks=("vt",), rounds=0)


@pytest.mark.parametrize("spec, fields", [("dense", (0, "nr", "native", None, "uniform")),
                                          ("wr64+int8", (64, "wr", "int8", None, "uniform")),
                                          ("rand16@2027", (16, "nr", "native", 2027, "uniform")),
                                          ("nr16+horizon", (16, "nr", "native", None, "horizon")),
                                          ("nr64+horizon@1234", (64, "nr", "native", None, "horizon@1234"))])
def test_arm_specs(spec, fields):
    a = parse_arm(spec)
    assert (a.wmax, a.policy, a.codec, a.mask_seed, a.precision) == fields
    # the engine and dasc-build get the precision only where it is not the default
    assert ("--precision" in a.build_flags()) == (a.precision != "uniform") == ("precision" in a.engine_fields())
    with pytest.raises(ValueError, match="expected dense"):
        parse_arm("nr")
    with pytest.raises(ValueError, match="dense keeps every unit"):
        parse_arm("dense+horizon")
    with pytest.raises(ValueError, match="expected dense"):
        parse_arm("nr16+int8+horizon")


def _arm(spec, scores):
    return {"arm": spec, "misses": [], "scores": {"t": {"100": {str(i): {"score": s} for i, s in enumerate(scores)}}}}


def test_comparisons_pair_instances_and_adjust():
    n = 60
    rng = np.random.default_rng(0)
    dense = rng.integers(0, 2, n).astype(float)
    results = [_arm("dense", dense), _arm("nr16", dense), _arm("wr16", dense)]
    # five masks, each right on a random half of the instances: mean 0.5 below nr where nr is right
    results += [_arm(f"rand16@{s}", dense * rng.integers(0, 2, n)) for s in (1, 2, 3, 4, 5)]
    drop = _arm("nr64", dense[:-10])                     # 10 instances missed: dropped from its comparison
    results += [drop, _arm("rand64@1", dense[:-10])]
    comp = comparisons(results, resamples=2000)
    assert comp["nr_vs_dense"][16]["diff"] == 0.0 and comp["nr_vs_dense"][16]["p"] == 1.0
    r = comp["nr_vs_random"][16]
    expect = np.mean([dense[i] - np.mean([results[3 + k]["scores"]["t"]["100"][str(i)]["score"] for k in range(5)])
                      for i in range(n)])
    assert r["diff"] == pytest.approx(expect) and r["masks"] == 5 and r["p"] < 0.01
    assert r["ci"][0] < r["diff"] < r["ci"][1]
    assert comp["nr_vs_dense"][64]["n"] == n - 10 and comp["nr_vs_dense"][64]["dropped"] == 10
    # Holm over W = 16, 64 within a family: never below the raw p
    assert all(c["p_holm"] >= c["p"] for fam in comp.values() for c in fam.values() if c.get("n"))
    assert "nr_vs_random" in format_comparisons(comp)
    acc = accuracy_table(results)
    assert acc["dense"]["accuracy"] == pytest.approx(dense.mean()) and acc["nr64"]["scored"] == n - 10


def test_sharded_runs_merge_into_the_unsharded_result(kda_model, tmp_path, capsys):
    from trtllm_dasc.evals.run import main
    common = ["--model", kda_model, "--arms", "dense,nr16,rand16@1234", "--tasks", "niah_single_1,qa_1",
              "--lengths", "160", "--instances", "3", "--max-batch", "3", "--resamples", "500"]
    assert main(common + ["--out", str(tmp_path / "all.json")]) == 0
    for i in range(2):
        assert main(common + ["--shard", f"{i}/2", "--out", str(tmp_path / f"part{i}.json")]) == 0
    parts = [str(tmp_path / f"part{i}.json") for i in range(2)]
    assert json.loads(open(parts[0]).read())["shard"] == "0/2"
    assert main(["--merge", *parts, "--out", str(tmp_path / "merged.json")]) == 0
    whole, merged = (json.loads(open(tmp_path / f).read()) for f in ("all.json", "merged.json"))
    assert [a["arm"] for a in merged["arms"]] == ["dense", "nr16", "rand16@1234"]
    assert merged["accuracy"] == whole["accuracy"] and merged["comparisons"] == whole["comparisons"]
    # a part twice, or parts of different instances, are refused in one line
    assert main(["--merge", parts[0], parts[0], "--out", str(tmp_path / "x.json")]) == 2
    other = json.loads(open(parts[1]).read())
    other["instances"] = 4
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["--merge", parts[0], str(tmp_path / "other.json"), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "is in both" in err and "differs from" in err and "instances" in err
    assert main(["--out", str(tmp_path / "x.json")]) == 2 and main(common + ["--shard", "2/2", "--out", "x"]) == 2
    # a shard that never wrote (killed before its first arm) is skipped, and what is missing is said
    assert main(["--merge", parts[0], str(tmp_path / "never.json"), "--out", str(tmp_path / "half.json")]) == 0
    half = json.loads((tmp_path / "half.json").read_text())
    # missing: the arms this run was given that no part holds, nothing from the other presets
    assert [a["arm"] for a in half["arms"]] == ["dense", "rand16@1234"] and half["missing_arms"] == ["nr16"]
    assert "skipping" in capsys.readouterr().err


def test_training_on_chosen_tasks_and_bad_ones_refused(tmp_path, monkeypatch):
    import trtllm_dasc.evals.mixture as mixture
    drawn = []
    real_make = mixture.make
    monkeypatch.setattr(mixture, "make", lambda task, *a: drawn.append(task) or real_make(task, *a))
    meta = train(TrainConfig(arch="kda", **TINY, tasks=("qa_1", "vt")), str(tmp_path / "m"), minutes=2,
                 device="cpu", max_steps=1, log=lambda m: None)
    assert list(meta["config"]["tasks"]) == ["qa_1", "vt"] and drawn and set(drawn) <= {"qa_1", "vt"}
    assert meta["task_answer_loss"] and set(meta["task_answer_loss"]) <= {"qa_1", "vt"}
    from trtllm_dasc.evals.train import TaskLosses
    window = TaskLosses(window=2)
    window.add(["vt", "qa_1", "vt", "vt"], [9.0, 1.0, 2.0, 4.0])     # vt keeps its last two rows
    assert window.means() == {"qa_1": 1.0, "vt": 3.0} and window.summary() == "qa_1 1.00, vt 3.00"
    with pytest.raises(ValueError, match="unknown task"):
        train(TrainConfig(arch="kda", **TINY, tasks=("nope",)), str(tmp_path / "n"), minutes=1, device="cpu",
              max_steps=1, log=lambda m: None)


def test_a_stage_exports_the_model_it_holds_and_remembers_its_runs(tmp_path):
    """The device returns only the fp32 stage; --export must write those very weights (bf16, decay tensors
    fp32) with the runs that made them, and a resumed run adds its own."""
    from safetensors.torch import load_file

    from trtllm_dasc.evals.train import main
    cfg = TrainConfig(arch="kda", **TINY, decay_init="default")
    train(cfg, str(tmp_path / "a"), minutes=2, device="cpu", max_steps=1, stage=str(tmp_path / "s"), log=lambda m: None)
    train(cfg, str(tmp_path / "b"), minutes=2, device="cpu", max_steps=2, resume=str(tmp_path / "s"),
          stage=str(tmp_path / "s2"), log=lambda m: None)
    stage = torch.load(tmp_path / "s2" / "train_state.pt")
    assert [r["steps"] for r in stage["runs"]] == [[0, 1], [1, 2]]
    # transformers' own init, not the paper's profile: the option reached the model (one step of lr-warm-up
    # training moves dt_bias by far less than the two inits differ)
    paper = build_model(TrainConfig(arch="kda", **TINY)).state_dict()
    gaps = [float((stage["model"][k] - paper[k]).abs().max()) for k in paper if k.endswith("dt_bias")]
    assert gaps and min(gaps) > 0.5, gaps
    assert main(["--export", str(tmp_path / "s2" / "train_state.pt"), "--out", str(tmp_path / "exp")]) == 0
    saved = load_file(str(tmp_path / "exp" / "model.safetensors"))
    assert len(saved) > 0.9 * len(stage["model"])
    for name, weight in stage["model"].items():
        if name not in saved:
            continue                    # buffers save_pretrained leaves out
        want = weight.float() if name.endswith(("A_log", "dt_bias")) else weight.to(torch.bfloat16)
        assert saved[name].dtype == want.dtype and torch.equal(saved[name], want), name
    meta = json.loads((tmp_path / "exp" / "train_meta.json").read_text())
    assert meta["steps"] == 2 and meta["config"]["decay_init"] == "default" and len(meta["runs"]) == 2
    assert main(["--export", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "x")]) == 2


def test_a_non_finite_gradient_skips_its_update_and_a_resume_can_restart_the_curriculum(tmp_path, monkeypatch):
    """A NaN gradient norm must not reach Adam (it would turn every weight into NaN) nor count as a step;
    --restart-curriculum starts a resumed run at the first stage's length (256) instead of the final one's."""
    from dataclasses import replace

    from trtllm_dasc.evals.curriculum import LengthCurriculum
    real_clip = torch.nn.utils.clip_grad_norm_
    calls = []

    def nan_on_the_first_call(params, max_norm):
        calls.append(1)
        norm = real_clip(params, max_norm)
        return torch.tensor(float("nan")) if len(calls) == 1 else norm
    # one 256-token stage of one step, then the final stage (384 tokens: TINY's max_length)
    cfg = TrainConfig(arch="kda", **TINY, curriculum=LengthCurriculum(start=256, stage_steps=1, min_stage_steps=1))
    train(cfg, str(tmp_path / "a"), minutes=2, device="cpu", max_steps=1, stage=str(tmp_path / "s"), log=lambda m: None)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", nan_on_the_first_call)
    logs = []
    meta = train(cfg, str(tmp_path / "b"), minutes=2, device="cpu", max_steps=2, resume=str(tmp_path / "s"),
                 log=logs.append)
    assert len(calls) == 2 and meta["steps"] == 2 and any("update skipped" in m for m in logs)
    assert meta["loss_curve"][-1][1] == 384              # the staged run's final stage went on
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    again = train(replace(cfg, restart_curriculum=True), str(tmp_path / "c"), minutes=2, device="cpu",
                  max_steps=2, resume=str(tmp_path / "s"), log=lambda m: None)
    assert again["loss_curve"][-1][1] == 256 and all(map(np.isfinite, np.asarray(again["loss_curve"])[:, 2]))


def test_per_row_answer_losses_add_up_to_the_answer_loss():
    """The per-task view splits the pooled answer loss by row: weighted by each row's answer tokens, the
    rows' losses must give back the pooled one, and each row's must equal a direct cross-entropy."""
    import torch.nn.functional as F

    from trtllm_dasc.evals.mixture import TrainingMixture
    from trtllm_dasc.evals.train import loss_fn
    from trtllm_dasc.evals.vocab import TaskVocab
    model = build_model(TrainConfig(arch="kda", **TINY)).eval()
    mix = TrainingMixture(vocab=TaskVocab(256), min_length=200, max_length=300, tasks=("qa_1", "vt"))
    tokens, mask, tasks = mix.batch(3, 300, np.random.default_rng(3), with_tasks=True)
    assert len(tasks) == 3 and set(tasks) <= {"qa_1", "vt"}
    tokens, mask = torch.as_tensor(tokens), torch.as_tensor(mask)
    with torch.no_grad():
        _, answer_loss, _, rows = loss_fn(model, tokens, mask, 0.1, with_accuracy=True)
        logits = model(input_ids=tokens).logits.float()
    counts = mask[:, 1:].sum(1).float()
    assert torch.allclose((rows * counts).sum() / counts.sum(), answer_loss, atol=1e-5)
    for b in range(3):
        where = mask[b, 1:].nonzero()[:, 0]
        direct = F.cross_entropy(logits[b, where], tokens[b, where + 1])
        assert torch.allclose(rows[b], direct, atol=1e-5)
