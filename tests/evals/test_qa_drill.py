"""qa drills (evals/qa_drill.py): every drill answer and the final answer are checked against a brute-force
reading of the example's own tokens, not against the drill code."""
import numpy as np
import pytest

from trtllm_dasc.errors import UserError
from trtllm_dasc.evals import train
from trtllm_dasc.evals.mixture import TrainingMixture
from trtllm_dasc.evals.vocab import TaskVocab as V


def facts_by_scan(tokens):
    """(s, r) -> [o, ...] for every 4-token run 's r o SEP' that follows a DOC or a SEP inside the documents."""
    found = {}
    end = np.flatnonzero(tokens == V.QUERY)[0]
    for i in range(1, end - 3):
        if tokens[i - 1] in (V.DOC, V.SEP) and tokens[i + 3] == V.SEP and np.flatnonzero(tokens[:i] == V.DOC).size:
            found.setdefault((int(tokens[i]), int(tokens[i + 1])), []).append(int(tokens[i + 2]))
    return found


def rows(task, drill, length=1024, n=12, seed=3):
    mixture = TrainingMixture(min_length=length, max_length=length, tasks=(task,), qa_drill=drill)
    tokens, mask = mixture.batch(n, length, np.random.default_rng(seed))
    for t, m in zip(tokens, mask):
        keep = t != V.PAD
        yield t[keep], m[keep]


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_every_target_is_what_the_documents_say(task):
    drilled_lines = 0
    for tokens, mask in rows(task, drill=16):
        facts = facts_by_scan(tokens)
        queries = np.flatnonzero(tokens == V.QUERY)
        final = queries[-1]
        # the final question and its answer, resolved from the documents by hand
        s, r1 = int(tokens[final + 1]), int(tokens[final + 2])
        asked = [(s, r1)]
        answer = facts[(s, r1)]
        if task == "qa_2":
            (middle,) = answer
            asked.append((middle, int(tokens[final + 3])))
            answer = facts[asked[-1]]
        assert answer == [int(tokens[-2])] and tokens[-1] == V.EOS
        targets = set(np.flatnonzero(mask).tolist())
        expected = {len(tokens) - 2, len(tokens) - 1}
        for q in queries[:-1]:
            s_i, r_i, marker, o_i = (int(x) for x in tokens[q + 1:q + 5])
            assert marker == V.ANSWER
            assert facts[(s_i, r_i)] == [o_i], "a drill answer must be the one object of its pair"
            assert (s_i, r_i) not in asked, "a drill must not ask what the final question asks"
            expected.add(int(q) + 4)
        assert targets == expected
        drilled_lines += len(queries) - 1
    assert drilled_lines >= 12 * 10          # most examples of 1k tokens take the 16 lines asked for


def test_drill_lines_fit_the_length_and_leave_documents():
    for length, cap in ((256, 16), (1024, 16), (1024, 3)):
        for tokens, mask in rows("qa_1", drill=cap, length=length):
            assert len(tokens) <= length
            lines = int((tokens == V.QUERY).sum()) - 1
            assert lines <= cap
            assert (tokens == V.DOC).sum() >= 1 and len(facts_by_scan(tokens)) >= 2 * lines


def test_no_drill_is_the_plain_stream_and_other_tasks_never_change():
    # qa_drill=0 examples are the encoded instances evaluation's grammar has: one question, two targets
    for tokens, mask in rows("qa_1", drill=0):
        assert (tokens == V.QUERY).sum() == 1 and mask.sum() == 2
    # a mixture without qa makes the same batches whatever qa_drill says (its draws never reach the drill)
    tasks = ("niah_single_1", "vt", "fwe")
    plain = TrainingMixture(min_length=512, max_length=1024, tasks=tasks).batch(8, 1024, np.random.default_rng(1))
    drilled = TrainingMixture(min_length=512, max_length=1024, tasks=tasks,
                              qa_drill=16).batch(8, 1024, np.random.default_rng(1))
    assert all((a == b).all() for a, b in zip(plain, drilled))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_bad_drill_counts_are_refused(bad):
    with pytest.raises(UserError, match="qa_drill"):
        TrainingMixture(qa_drill=bad)
    with pytest.raises(ValueError, match="--qa-drill"):
        train.TrainConfig(qa_drill=bad).check()


def test_cli_refuses_a_negative_drill(tmp_path, capsys):
    assert train.main(["--device", "cpu", "--out", str(tmp_path / "m"), "--qa-drill", "-2", "--max-steps", "1"]) == 2
    assert "--qa-drill must be a non-negative integer" in capsys.readouterr().err


def test_the_final_answer_loss_is_the_last_questions_own():
    """loss_fn(with_final=True): each row's loss on the token after its last ANSWER, recomputed here in float64
    from random logits at the final answer's position found by hand (the third token from a row's end)."""
    import torch
    from types import SimpleNamespace
    from trtllm_dasc.evals.train import loss_fn
    mixture = TrainingMixture(min_length=512, max_length=512, tasks=("qa_1", "vt"), qa_drill=8)
    tokens, mask = mixture.batch(6, 512, np.random.default_rng(4))
    logits = np.random.default_rng(5).normal(size=(*tokens.shape, 512)).astype(np.float32)
    model = lambda input_ids: SimpleNamespace(logits=torch.as_tensor(logits))   # noqa: E731
    *_, rows, final = loss_fn(model, torch.as_tensor(tokens), torch.as_tensor(mask), 0.0, with_accuracy=True,
                              with_final=True)
    drilled_rows = 0
    for r, t in enumerate(tokens):
        n = int((t != V.PAD).sum())
        # from the formats, not from the ANSWER marker: qa ends "ANSWER o EOS", vt "ANSWER x1 .. x5 EOS"
        is_qa = t[n - 3] == V.ANSWER
        answer_at = n - 2 if is_qa else n - 6
        assert t[n - 1] == V.EOS and (is_qa or t[n - 7] == V.ANSWER)
        z = logits[r, answer_at - 1].astype(np.float64)
        want = np.log(np.exp(z - z.max()).sum()) + z.max() - z[t[answer_at]]
        assert float(final[r]) == pytest.approx(want, rel=1e-5)
        if is_qa:                                            # a drilled qa row: its row loss is not the final's
            drilled_rows += 1
            assert (t == V.QUERY).sum() > 1 and abs(float(rows[r]) - want) > 1e-3
    assert 0 < drilled_rows < len(tokens)
