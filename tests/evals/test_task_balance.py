"""Task balance of the quality models' training: each example weighted alike in the loss (answer_weighting
"row") and the tasks drawn by their recent losses (task_sampling "loss").

References: the weights are recomputed by hand from the rule in task_weights_from_losses' docstring; the
row-weighted loss by a numpy log-softmax over fixed logits, row by row; the weighted draws by their
counts against the asked probabilities (a binomial bound, not an exact count)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from trtllm_dasc.errors import UserError
from trtllm_dasc.evals.mixture import TrainingMixture, task_weights_from_losses
from trtllm_dasc.evals.prefetch import BatchPrefetcher
from trtllm_dasc.evals.tasks import TASKS
from trtllm_dasc.evals.vocab import TaskVocab

MIXTURE = TrainingMixture(vocab=TaskVocab(256), min_length=256, max_length=384, seed=5)
TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=384, tokens_per_step=768)


def test_weights_are_half_uniform_half_by_loss():
    got = task_weights_from_losses(["a", "b", "c", "d"], {"a": 0.0, "b": 1.0, "c": 3.0})
    # d has no loss yet: it counts as the largest (3), so the losses are 0, 1, 3, 3 of 7
    want = [0.5 / 4 + 0.5 * x / 7 for x in (0, 1, 3, 3)]
    assert got == pytest.approx(want) and sum(got) == pytest.approx(1.0)
    assert task_weights_from_losses(["a", "b"], {}) == pytest.approx([0.5, 0.5])
    assert task_weights_from_losses(["a", "b"], {"a": 0.0, "b": 0.0}) == pytest.approx([0.5, 0.5])
    assert task_weights_from_losses(["a", "b"], {"a": 1.0, "b": 3.0}, uniform_share=1.0) == pytest.approx([0.5, 0.5])
    with pytest.raises(UserError, match="uniform_share"):
        task_weights_from_losses(["a"], {}, uniform_share=1.5)


def test_weighted_draws_follow_the_weights():
    weights = np.zeros(len(TASKS))
    weights[TASKS.index("qa_1")], weights[TASKS.index("vt")] = 0.8, 0.2
    rng = np.random.default_rng(0)
    tasks = [MIXTURE.draw(rng, 256, tuple(weights)).task for _ in range(1000)]
    assert set(tasks) == {"qa_1", "vt"}
    # 1000 draws at p = 0.8: the standard deviation of the count is about 12.6; 5 of them is 63
    assert abs(tasks.count("qa_1") - 800) < 63
    only = tuple(float(t == "cwe") for t in TASKS)
    _, _, batch_tasks = MIXTURE.batch(6, 384, np.random.default_rng(1), with_tasks=True, task_weights=only)
    assert batch_tasks == ["cwe"] * 6


@pytest.mark.parametrize("bad", [(1.0,) * 3, (-1.0,) + (1.0,) * 12, (float("nan"),) * 13, (0.0,) * 13])
def test_bad_weights_get_a_clear_error(bad):
    with pytest.raises(UserError, match="task_weights must be 13"):
        MIXTURE.batch(2, 384, np.random.default_rng(0), task_weights=bad)


@pytest.mark.parametrize("background", [True, False])
def test_a_prefetched_weighted_batch_is_the_mixtures(background):
    weights = task_weights_from_losses(MIXTURE.tasks, {"qa_1": 9.0, "cwe": 5.0})
    with BatchPrefetcher(MIXTURE, (3, 0), background=background) as prefetch:
        prefetch.submit(4, 384, weights)
        tokens, mask, tasks, _ = prefetch.take()
    want_tokens, want_mask, want_tasks = MIXTURE.batch(4, 384, np.random.default_rng([3, 0, 0]), with_tasks=True,
                                                       task_weights=weights)
    assert np.array_equal(tokens, want_tokens) and np.array_equal(mask, want_mask) and tasks == want_tasks


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("weighting", ["token", "row"])
def test_the_answer_loss_weights_tokens_or_rows(weighting):
    import torch
    from trtllm_dasc.evals.train import loss_fn
    rng = np.random.default_rng(2)
    vocab, length = 11, 9
    logits = rng.normal(size=(3, length, vocab)).astype(np.float32)
    tokens = rng.integers(1, vocab, size=(3, length))
    mask = np.zeros((3, length), dtype=bool)
    mask[0, 8:] = True              # one answer token
    mask[1, 3:9] = True             # six
    # row 2: no answer at all (counts in neither weighting)
    model = lambda input_ids: SimpleNamespace(logits=torch.as_tensor(logits))   # noqa: E731
    loss, answer_loss, _, rows = loss_fn(model, torch.as_tensor(tokens), torch.as_tensor(mask), 0.0,
                                         with_accuracy=True, answer_weighting=weighting)
    ce = -np.take_along_axis(_log_softmax(logits.astype(np.float64))[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    answer = mask[:, 1:]
    per_row = [ce[r][answer[r]].mean() for r in (0, 1)]
    token_mean = ce[answer].mean()
    assert float(answer_loss) == pytest.approx(token_mean, rel=1e-5)          # logged: always the token mean
    assert rows[:2].tolist() == pytest.approx(per_row, rel=1e-5) and float(rows[2]) == 0.0
    want = np.mean(per_row) if weighting == "row" else token_mean
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert abs(np.mean(per_row) - token_mean) > 0.05        # the two weightings differ on this batch


def test_the_gated_loss_is_the_uniform_mixes_token_mean():
    """Rows drawn by loss over-represent the hard tasks; the answer loss the curriculum's gate reads is
    reweighted to a uniform draw: each row (1/K) / p(task) times its answer tokens."""
    from trtllm_dasc.evals.train import uniform_mix_answer_loss
    tasks = ("a", "b")
    # rows: a (7 tokens, loss 0.1), b (1 token, loss 3.0), b (1 token, loss 2.0)
    losses, tokens, row_tasks = [0.1, 3.0, 2.0], [7, 1, 1], ["a", "b", "b"]
    # uniform weights: the plain token mean (0.7 + 3 + 2) / 9
    assert uniform_mix_answer_loss(losses, tokens, row_tasks, tasks, (0.5, 0.5)) == pytest.approx(5.7 / 9)
    # b drawn 4x as often as a (0.8 vs 0.2): a's row counts 0.5/0.2 = 2.5, b's rows 0.5/0.8 = 0.625 each
    want = (2.5 * 7 * 0.1 + 0.625 * 3.0 + 0.625 * 2.0) / (2.5 * 7 + 0.625 + 0.625)
    assert uniform_mix_answer_loss(losses, tokens, row_tasks, tasks, (0.2, 0.8)) == pytest.approx(want)


def test_a_resumed_run_samples_by_the_stages_task_losses(tmp_path, monkeypatch):
    """The stage keeps each task's recent losses; a run resumed with task_sampling "loss" draws its first
    batch from them (here qa_1 has the only loss: half the rows uniform, the other half all qa_1)."""
    import torch
    from trtllm_dasc.evals import train as T
    cfg = T.TrainConfig(arch="kda", **TINY, answer_weighting="row", task_sampling="loss")
    T.train(cfg, str(tmp_path / "m1"), 5, "cpu", stage=str(tmp_path / "s"), max_steps=2, log=lambda m: None)
    path = tmp_path / "s" / "train_state.pt"
    state = torch.load(path)
    assert set(state["task_losses"]) <= set(TASKS) and state["task_losses"]     # rows of the two steps
    state["task_losses"] = {t: [9.0 if t == "qa_1" else 0.0] for t in TASKS}
    torch.save(state, path)
    submitted = []
    real_submit = BatchPrefetcher.submit
    monkeypatch.setattr(T.BatchPrefetcher, "submit",
                        lambda self, b, n, w=None: (submitted.append(w), real_submit(self, b, n, w))[1])
    T.train(cfg, str(tmp_path / "m2"), 5, "cpu", resume=str(path), max_steps=3, log=lambda m: None)
    want = [0.5 / 13 + (0.5 if t == "qa_1" else 0.0) for t in TASKS]
    assert submitted[0] == pytest.approx(want)


def test_the_large_preset_balances_tasks_and_a_flag_overrides_it(monkeypatch):
    from trtllm_dasc.evals import train as T
    from trtllm_dasc.evals.train import SIZES, TrainConfig
    seen = []
    monkeypatch.setattr(T, "train", lambda cfg, *a, **k: seen.append(cfg) or {"steps": 0, "seconds": 0})
    assert T.main(["--size", "large", "--out", "x"]) == 0
    assert T.main(["--size", "large", "--answer-weighting", "token", "--task-sampling", "uniform", "--out", "x"]) == 0
    assert (seen[0].answer_weighting, seen[0].task_sampling) == ("row", "loss")
    assert (seen[1].answer_weighting, seen[1].task_sampling) == ("token", "uniform")
    assert SIZES["large"]["answer_weighting"] == "row" and SIZES["large"]["task_sampling"] == "loss"
    assert TrainConfig().answer_weighting == "token" and TrainConfig().task_sampling == "uniform"
    with pytest.raises(ValueError, match="--answer-weighting"):
        TrainConfig(answer_weighting="rows").check()
    with pytest.raises(ValueError, match="--task-sampling"):
        TrainConfig(task_sampling="adaptive").check()


@pytest.mark.parametrize("sampling", ["uniform", "loss"])
def test_the_curve_and_the_gate_read_the_uniform_mix_loss_when_rows_are_drawn_by_loss(tmp_path, monkeypatch,
                                                                                      sampling):
    from trtllm_dasc.evals import train as T
    seen = []
    monkeypatch.setattr(T, "uniform_mix_answer_loss", lambda *a: seen.append(a) or 123.0)
    cfg = T.TrainConfig(arch="kda", **TINY, task_sampling=sampling)
    meta = T.train(cfg, str(tmp_path / "m"), 5, "cpu", max_steps=1, log=lambda m: None)
    assert (meta["loss_curve"][0][2] == 123.0) == (sampling == "loss")
    assert (meta["curriculum"]["ema"] == 123.0) == (sampling == "loss")
    if seen:                                           # the batch's own rows and the weights it was drawn with
        losses, tokens, row_tasks, tasks, weights = seen[0]
        assert len(losses) == len(tokens) == len(row_tasks) >= 1 and all(n > 0 for n in tokens)
        assert weights == pytest.approx([1 / 13] * 13)    # no losses known yet: uniform
