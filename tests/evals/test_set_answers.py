"""The set-scored tasks (vt, cwe, fwe: tasks.SCORING "set") are trained in any order, as they are scored.

cwe's target order is the order in which its ten equally frequent words first appeared, which the scorer
ignores: trained as a sequence, a model that knows the ten words but not that order paid about ln(10!)/11 =
1.37 nats an answer token (session 39's models: cwe "stuck at 2.3" while scoring up to 0.88 on 2k prompts).

References: the losses are recomputed in numpy from fixed logits, item by item, from the rule in
train.set_answer_loss' docstring; the scorer (tasks.score) says which orders are right."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from trtllm_dasc.evals.mixture import TrainingMixture, encode
from trtllm_dasc.evals.tasks import SCORING, make, score
from trtllm_dasc.evals.vocab import TaskVocab

VOCAB = TaskVocab(256)
TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=384, tokens_per_step=768)


def _stub(logits):
    return lambda input_ids: SimpleNamespace(logits=__import__("torch").as_tensor(logits))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_a_model_that_knows_the_cwe_words_but_not_their_order_costs_nothing():
    """Logits that put the same high score on every cwe word not yet given (and on EOS after them): greedy
    decoding emits the ten words in an order the scorer takes as right, so their loss must be about zero."""
    import torch
    from trtllm_dasc.evals.train import loss_fn
    x = make("cwe", 244, 10 ** 6 + 3, VOCAB)
    tokens, mask = encode(x)
    start = len(x.prompt)                       # logits[start + i] predict answer token i
    logits = np.zeros((1, len(tokens), VOCAB.vocab_size), dtype=np.float32)
    for i in range(len(x.answer)):
        logits[0, start + i, list(x.answer[i:])] = 30.0
    logits[0, start + len(x.answer), TaskVocab.EOS] = 30.0
    # what greedy decoding of these logits gives (ties: the lowest id) scores 1.0
    greedy = sorted(x.answer)
    assert greedy != list(x.answer) and score(x, greedy) == 1.0
    t, m = torch.as_tensor(tokens[None]), torch.as_tensor(mask[None])
    _, answer_loss, accuracy, rows = loss_fn(_stub(logits), t, m, 0.0, with_accuracy=True,
                                             set_rows=torch.tensor([True]))
    assert float(answer_loss) < 1e-6 and float(rows[0]) < 1e-6 and float(accuracy) == 1.0
    # in the target order the same logits cost ln(10!) over the 11 answer tokens
    _, ordered = loss_fn(_stub(logits), t, m, 0.0)
    assert float(ordered) == pytest.approx(math.log(math.factorial(10)) / 11, rel=1e-4)


def test_the_set_loss_of_a_mixed_batch_matches_numpy():
    """vt / cwe / fwe rows: item i costs -log p(any of items i.. of its row); the EOS after them and the rows of
    the other tasks keep their cross-entropy; an item already given is no longer a target."""
    import torch
    from trtllm_dasc.evals.train import loss_fn
    mixture = TrainingMixture(vocab=VOCAB, min_length=256, max_length=300,
                              tasks=("vt", "cwe", "fwe", "niah_single_1"), seed=1)
    tokens, mask, tasks = mixture.batch(8, 300, np.random.default_rng(5), with_tasks=True)
    assert {"vt", "cwe", "fwe", "niah_single_1"} <= set(tasks)
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(*tokens.shape, VOCAB.vocab_size)).astype(np.float32)
    # make the set rule matter: every answer position favours some later item of its row
    for r in range(len(tokens)):
        where = np.nonzero(mask[r])[0][:-1]
        for i, p in enumerate(where):
            logits[r, p - 1, tokens[r, where[rng.integers(i, len(where))]]] += 4.0
    sets = np.array([SCORING[t] == "set" for t in tasks])
    _, answer_loss, accuracy, rows = loss_fn(_stub(logits), torch.as_tensor(tokens), torch.as_tensor(mask), 0.0,
                                             with_accuracy=True, set_rows=torch.as_tensor(sets))
    logp = _log_softmax(logits.astype(np.float64))
    want_rows, all_ce, right = [], [], []
    for r in range(len(tokens)):
        where = np.nonzero(mask[r])[0]                  # answer items, then EOS
        items = tokens[r, where[:-1]]
        ce = []
        for i, p in enumerate(where):
            lp = logp[r, p - 1]
            if sets[r] and i < len(items):
                ce.append(-np.log(np.exp(lp[items[i:]]).sum()))
                right.append(lp.argmax() in items[i:])
            else:
                ce.append(-lp[tokens[r, p]])
                right.append(lp.argmax() == tokens[r, p])
        want_rows.append(np.mean(ce))
        all_ce += ce
    assert rows.tolist() == pytest.approx(want_rows, rel=1e-5)
    assert float(answer_loss) == pytest.approx(np.mean(all_ce), rel=1e-5)
    assert float(accuracy) == pytest.approx(np.mean(right))
    # the set rows cost less than in the target order, the others the same
    _, _, _, ordered = loss_fn(_stub(logits), torch.as_tensor(tokens), torch.as_tensor(mask), 0.0, with_accuracy=True)
    assert all((a < b - 1e-3) if s else a == pytest.approx(b, rel=1e-6)
               for a, b, s in zip(rows.tolist(), ordered.tolist(), sets))


@pytest.mark.parametrize("order", ["any", "target"])
def test_the_trainer_marks_the_set_scored_rows(tmp_path, monkeypatch, order):
    from trtllm_dasc.evals import train as T
    seen = []
    real = T.forward_backward

    def spy(model, opt, tokens, mask, cfg, amp, *rest, **kwargs):
        seen.append((rest, kwargs))
        return real(model, opt, tokens, mask, cfg, amp, *rest, **kwargs)
    monkeypatch.setattr(T, "forward_backward", spy)
    tasks_seen = []
    real_take = T.BatchPrefetcher.take
    monkeypatch.setattr(T.BatchPrefetcher, "take", lambda self: (lambda b: tasks_seen.append(b[2]) or b)(real_take(self)))
    cfg = T.TrainConfig(arch="kda", **TINY, tasks=("cwe", "niah_single_1"), set_order=order)
    T.train(cfg, str(tmp_path / "m"), 5, "cpu", max_steps=1, log=lambda m: None)
    (rest, kwargs), = seen
    set_rows = (list(rest) + list(kwargs.values()) + [None])[0]
    if order == "target":
        assert set_rows is None
    else:
        assert set_rows.tolist() == [t == "cwe" for t in tasks_seen[0]]


def test_set_order_is_a_flag_and_any_is_the_default(monkeypatch):
    from trtllm_dasc.evals import train as T
    seen = []
    monkeypatch.setattr(T, "train", lambda cfg, *a, **k: seen.append(cfg) or {"steps": 0, "seconds": 0})
    assert T.main(["--out", "x"]) == 0 and T.main(["--set-order", "target", "--out", "x"]) == 0
    assert [c.set_order for c in seen] == ["any", "target"]
    with pytest.raises(ValueError, match="--set-order"):
        T.TrainConfig(set_order="sorted").check()
