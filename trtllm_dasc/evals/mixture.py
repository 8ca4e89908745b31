"""Training data from the synthetic tasks: BOS + prompt + answer + EOS, with a loss mask on the answer.

Training instances use seeds drawn from [TRAIN_SEED_BASE, 2**62) with TRAIN_SEED_BASE = EVAL_SEED_LIMIT
(10**6), while evaluation uses seeds below it (``tasks.evaluation_instances``): the two seed spaces never
meet, so a model is never scored on an instance it was trained on.

The loss mask marks the positions whose *token* is a target: the answer tokens and the closing EOS. With
the usual shift (logits at t - 1 predict tokens[t]) the loss counts where ``loss_mask[t]`` holds.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from trtllm_dasc.errors import UserError
from trtllm_dasc.evals.qa_drill import DRILL_TOKENS, drill_count, drilled_example
from trtllm_dasc.evals.tasks import ANSWER_LENGTH, EVAL_SEED_LIMIT, MIN_LENGTH, TASKS, Instance, make
from trtllm_dasc.evals.vocab import TaskVocab

TRAIN_SEED_BASE = EVAL_SEED_LIMIT
TRAIN_SEED_END = 2 ** 62
# BOS before the prompt, EOS after the answer
FRAME_TOKENS = 2


def is_count(value) -> bool:
    """A non-negative int (a bool is not one, though Python counts it as an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def encode(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """BOS + prompt + answer + EOS as int64, and the bool mask of the answer and EOS positions."""
    tokens = np.array((TaskVocab.BOS, *instance.prompt, *instance.answer, TaskVocab.EOS), dtype=np.int64)
    mask = np.zeros(len(tokens), dtype=bool)
    mask[1 + len(instance.prompt):] = True
    return tokens, mask


@dataclass
class TrainingMixture:
    """Mixture of ``tasks`` (uniform, or weighted per batch: ``batch(task_weights=...)``); each example's
    total length (BOS to EOS) is drawn uniformly from [min_length, max_length]. Instances come from
    training seeds only (>= TRAIN_SEED_BASE); ``seed`` seeds the generator used when a call passes no ``rng``."""
    vocab: TaskVocab = field(default_factory=TaskVocab)
    min_length: int = 256
    max_length: int = 1024
    tasks: tuple[str, ...] = tuple(TASKS)
    seed: int = 0
    # batch(): each row's example length within this many tokens below the batch length (None: anywhere in
    # [min_length, length]). Why: a batch is as long as its longest row, so rows drawn over [1k, 8k] in an 8k
    # batch leave 44% of its tokens as padding (34% over the final stage's lengths), computed and thrown away;
    # with the batch length itself drawn uniformly, rows near it still cover [min_length, max_length]
    row_spread: int | None = None
    # qa_1 / qa_2 examples ask up to this many extra one-hop questions about their own documents before the
    # final one, each answer a target (evals/qa_drill.py says why); 0: none, the examples evaluation sees
    qa_drill: int = 0
    _rng: np.random.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.tasks = tuple(self.tasks)
        if not self.tasks:
            raise UserError("a training mixture needs at least one task")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise UserError(f"unknown task {unknown[0]!r}; expected one of: {', '.join(TASKS)}")
        if not 0 < self.min_length <= self.max_length:
            raise UserError(f"need 0 < min_length <= max_length, got {self.min_length} and {self.max_length}")
        if self.row_spread is not None and not is_count(self.row_spread):
            raise UserError(f"row_spread must be a non-negative integer or None, got {self.row_spread!r}")
        if not is_count(self.qa_drill):
            raise UserError(f"qa_drill must be a non-negative integer, got {self.qa_drill!r}")
        for t in self.tasks:
            shortest = MIN_LENGTH[t] + ANSWER_LENGTH[t] + FRAME_TOKENS
            if self.min_length < shortest:
                raise UserError(f"min_length {self.min_length} is too short for task {t!r}: an example of it "
                                f"needs at least {shortest} tokens")
        self._rng = np.random.default_rng(self.seed)

    @property
    def shortest_example(self) -> int:
        """The fewest tokens (BOS to EOS) an example of every task of the mixture can have."""
        return max(MIN_LENGTH[t] + ANSWER_LENGTH[t] + FRAME_TOKENS for t in self.tasks)

    def draw(self, rng: np.random.Generator | None = None, total_length: int | None = None,
             task_weights: Sequence[float] | None = None) -> Instance:
        """One training instance whose encoded example holds ``total_length`` tokens (drawn if None); its
        task is drawn uniformly, or with the probabilities ``task_weights`` (one per task of the mixture).
        An instance has no drill lines: qa_drill shapes the examples of sample() and batch()."""
        return self._draw(self._rng if rng is None else rng, total_length,
                          None if task_weights is None else self._check_weights(task_weights))

    def _draw(self, rng: np.random.Generator, total_length: int | None, p: np.ndarray | None) -> Instance:
        """draw() with the task probabilities already checked and normalised (batch() does that once)."""
        task, prompt_length, seed = self._choose(rng, total_length, p)
        return make(task, prompt_length, seed, self.vocab)

    def _choose(self, rng: np.random.Generator, total_length: int | None,
                p: np.ndarray | None) -> tuple[str, int, int]:
        """An example's task, prompt length and training seed, drawn in this order (the stream of examples
        a mixture makes depends on it)."""
        if total_length is None:
            total_length = int(rng.integers(self.min_length, self.max_length + 1))
        task = self.tasks[int(rng.integers(len(self.tasks)))] if p is None else \
            self.tasks[int(rng.choice(len(self.tasks), p=p))]
        seed = int(rng.integers(TRAIN_SEED_BASE, TRAIN_SEED_END))
        return task, total_length - ANSWER_LENGTH[task] - FRAME_TOKENS, seed

    def _example(self, rng: np.random.Generator, total_length: int | None,
                 p: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, str]:
        """(tokens, mask, task) of one example of ``total_length`` tokens at most: an encoded instance, or for
        qa with qa_drill a shorter instance whose freed tokens hold drill lines (fewer when its documents
        have fewer facts that can be drilled, so the example may end a few lines short)."""
        task, prompt_length, seed = self._choose(rng, total_length, p)
        lines = drill_count(task, prompt_length, self.qa_drill)
        instance = make(task, prompt_length - lines * DRILL_TOKENS, seed, self.vocab)
        tokens, mask = drilled_example(instance, lines, rng) if lines else encode(instance)
        return tokens, mask, task

    def sample(self, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int64, loss_mask bool) of one example, its length drawn in [min_length, max_length]."""
        return self._example(self._rng if rng is None else rng, None, None)[:2]

    def _check_weights(self, task_weights: Sequence[float]) -> np.ndarray:
        p = np.asarray(task_weights, dtype=np.float64)
        if p.shape != (len(self.tasks),) or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise UserError(f"task_weights must be {len(self.tasks)} finite non-negative numbers with a positive "
                            f"sum (one per task: {', '.join(self.tasks)}), got {list(task_weights)}")
        return p / p.sum()

    def batch(self, batch_size: int, length: int, rng: np.random.Generator | None = None,
              with_tasks: bool = False, task_weights: Sequence[float] | None = None) -> tuple[np.ndarray, ...]:
        """[batch_size, length] tokens and loss mask; each row's example length is drawn in
        [min_length, max_length] clipped to ``length`` (and to its last ``row_spread`` tokens when set), and
        the row right-padded with PAD (mask False there). A ``length`` below min_length (a curriculum's short start) gives rows of exactly
        ``length`` tokens, as long as every task of the mixture fits. with_tasks: a third element, each
        row's task name (for per-task training losses). task_weights: each row's task drawn with these
        probabilities (``task_weights_from_losses``) instead of uniformly."""
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        if length < self.shortest_example:
            raise UserError(f"batch length {length} is too short: the mixture's tasks need at least "
                            f"{self.shortest_example} tokens")
        rng = self._rng if rng is None else rng
        tokens = np.full((batch_size, length), TaskVocab.PAD, dtype=np.int64)
        mask = np.zeros((batch_size, length), dtype=bool)
        longest = min(self.max_length, length)
        shortest = min(self.min_length, longest)
        if self.row_spread is not None:
            shortest = max(shortest, longest - self.row_spread)
        p = None if task_weights is None else self._check_weights(task_weights)
        tasks = []
        for row in range(batch_size):
            t, m, task = self._example(rng, int(rng.integers(shortest, longest + 1)), p)
            tokens[row, :len(t)], mask[row, :len(m)] = t, m
            tasks.append(task)
        return (tokens, mask, tasks) if with_tasks else (tokens, mask)


def task_weights_from_losses(tasks: Sequence[str], losses: Mapping[str, float],
                             uniform_share: float = 0.5) -> tuple[float, ...]:
    """Task probabilities for the next batch: ``uniform_share`` of the rows spread evenly over the tasks,
    the rest in proportion to each task's recent answer loss (a task with no loss yet counts as the
    largest). Why: drawn uniformly, the tasks a model has learned (the needles, loss near 0) take most of
    the steps while the unlearned ones (qa, cwe at chance after 4,000 steps, session 29) get a thirteenth
    each; the uniform share keeps the learned ones rehearsed."""
    if not 0.0 <= uniform_share <= 1.0:
        raise UserError(f"uniform_share must be in [0, 1], got {uniform_share}")
    known = [max(0.0, float(losses[t])) for t in tasks if t in losses]
    top = max(known, default=1.0)
    raw = np.array([max(0.0, float(losses[t])) if t in losses else top for t in tasks])
    by_loss = raw / raw.sum() if raw.sum() > 0 else np.full(len(tasks), 1.0 / len(tasks))
    return tuple(float(x) for x in uniform_share / len(tasks) + (1.0 - uniform_share) * by_loss)
