"""Synthetic RULER-like long-context tasks over a small token vocabulary: generation, scoring, training mix.

    from trtllm_dasc.evals import TaskVocab, make, score
    inst = make("niah_single_2", length=1024, seed=0, vocab=TaskVocab(512))
    score(inst, generated_tokens)          # 1.0 / 0.0 for exact tasks, item fraction for set tasks
"""
from trtllm_dasc.evals.mixture import TRAIN_SEED_BASE, TrainingMixture, encode
from trtllm_dasc.evals.tasks import (ANSWER_LENGTH, EVAL_SEED_LIMIT, MIN_LENGTH, SCORING, TASKS, Instance,
                                     answer_tokens, evaluation_instances, make, score)
from trtllm_dasc.evals.vocab import TaskVocab

__all__ = ["ANSWER_LENGTH", "EVAL_SEED_LIMIT", "MIN_LENGTH", "SCORING", "TASKS", "TRAIN_SEED_BASE", "Instance",
           "TaskVocab", "TrainingMixture", "answer_tokens", "encode", "evaluation_instances", "make", "score"]
