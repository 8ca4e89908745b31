"""Rows near the batch length (`TrainingMixture.row_spread`, `--row-lengths bucket`): a batch is as long as its
longest row, so rows drawn anywhere in [min_length, length] leave about a third of the final stage's tokens as
padding. The checks read each row's length back from its tokens (PAD never occurs inside an example), not from
the mixture's own bookkeeping."""
import numpy as np
import pytest

from trtllm_dasc.errors import UserError
from trtllm_dasc.evals.curriculum import LengthCurriculum
from trtllm_dasc.evals.mixture import TrainingMixture
from trtllm_dasc.evals.train import TrainConfig
from trtllm_dasc.evals.vocab import TaskVocab


def _row_lengths(tokens: np.ndarray) -> np.ndarray:
    """Each row's example length: its tokens up to the first PAD, checked to be BOS ... EOS then PAD only."""
    lengths = []
    for row in tokens:
        pad = np.flatnonzero(row == TaskVocab.PAD)
        n = int(pad[0]) if len(pad) else len(row)
        assert (row[n:] == TaskVocab.PAD).all()
        assert row[0] == TaskVocab.BOS and row[n - 1] == TaskVocab.EOS
        lengths.append(n)
    return np.array(lengths)


@pytest.mark.parametrize("length", [1024, 2048, 3584])
def test_rows_stay_within_the_spread_of_the_batch_length(length):
    mixture = TrainingMixture(min_length=512, max_length=4096, row_spread=256, seed=3)
    tokens, mask = mixture.batch(24, length, np.random.default_rng(length))
    lengths = _row_lengths(tokens)
    assert (lengths >= length - 256).all() and (lengths <= length).all(), lengths
    assert mask.sum(1).min() > 0                       # every row still has its answer to learn from


def test_without_a_spread_rows_range_down_to_min_length():
    mixture = TrainingMixture(min_length=512, max_length=4096, seed=3)
    lengths = _row_lengths(mixture.batch(32, 4096, np.random.default_rng(0))[0])
    # 32 rows all in the top 256 of [512, 4096] has probability (256 / 3585) ** 32: never
    assert lengths.min() < 4096 - 256


def test_the_spread_cuts_the_final_stage_padding():
    """Padding over the curriculum's final lengths, a step's tokens fixed: about 34% drawn uniformly
    (1 - (min + L) / 2L averaged over L), under 10% within one 512-token bucket."""
    final = LengthCurriculum(min_length=1024, max_length=8192).final_lengths
    padding = {}
    for spread in (None, 512):
        mixture = TrainingMixture(min_length=1024, max_length=8192, row_spread=spread,
                                  tasks=("niah_single_1", "niah_single_2", "fwe"))
        rng = np.random.default_rng(7)
        real = total = 0
        for length in final:
            tokens = mixture.batch(max(2, 32768 // length), length, rng)[0]
            real += int(_row_lengths(tokens).sum())
            total += tokens.size
        padding[spread] = 1 - real / total
    assert padding[None] > 0.25 and padding[512] < 0.10, padding


@pytest.mark.parametrize("spread", [-1, True, 1.5])
def test_a_bad_spread_is_refused(spread):
    with pytest.raises(UserError, match="row_spread"):
        TrainingMixture(row_spread=spread)


def test_the_trainer_refuses_an_unknown_row_length_rule():
    with pytest.raises(ValueError, match="--row-lengths"):
        TrainConfig(row_lengths="packed").check()


def test_the_flag_reaches_the_batches_a_training_step_uses(tmp_path, monkeypatch):
    """`--row-lengths bucket` through main(): the batch the (CPU) step trains on has every row within the
    curriculum's 512-token bucket of its length; the default run's batch does not."""
    from trtllm_dasc.evals import prefetch
    from trtllm_dasc.evals import train as T
    built = []
    real_build = prefetch.build_batch
    monkeypatch.setattr(prefetch, "build_batch", lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    # GDN: transformers' torch path of KDA is far slower on a CPU. 4 rows of 2048: all four drawn uniformly in
    # the top 512 of [256, 2048] has probability (512 / 1792) ** 4, under 1%, and the seed is fixed
    tiny = ["--arch", "gdn", "--device", "cpu", "--max-steps", "1", "--minutes", "2", "--min-length", "256",
            "--max-length", "2048", "--start-length", "2048", "--tokens-per-step", "8192",
            "--tasks", "niah_single_1,fwe"]
    for rule in ("bucket", "uniform"):
        built.clear()
        assert T.main([*tiny, "--row-lengths", rule, "--out", str(tmp_path / rule)]) == 0
        tokens, length = built[0][0], built[0][-1]
        lengths = _row_lengths(tokens)
        assert length == 2048 and len(lengths) == 4
        assert (lengths >= length - 512).all() == (rule == "bucket"), lengths
