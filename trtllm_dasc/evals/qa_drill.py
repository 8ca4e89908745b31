"""Training-only drills for qa_1 / qa_2: extra one-hop questions about the same documents, each answer a target.

Why: qa stayed at chance through ten thousand training steps (sessions 29-31), and a session-31 run that trained
the KDA model on qa alone for 610 steps left it there too, while the same model answers qa_1 zero-shot when
its facts and query wear niah's markers (``KEY s r VAL o SEP``, ``QUERY KEY s r ANSWER``: p(answer) 0.99 on 2 of
4 probes): the lookup exists, but not for the unmarked grammar, and one target token per 1k-token example
gives the plateau almost no signal. A drill asks K more questions about the example's own documents, in the
evaluation's one-hop query grammar (qa_1's; a qa_2 example's drills are one-hop too, its final question two),
before its final question:

    DOC (s r o SEP)* ... QUERY s1 r1 ANSWER o1 QUERY s2 r2 ANSWER o2 ... QUERY s r ANSWER -> o

and every ``o_i`` is a target, so an example carries K + 1 lookups instead of one (Zoology's multi-query
associative recall shape). Drilled facts are never the asked ones (a drill line would hand the final answer
over) and their (subject, relation) pair occurs once in the documents, so each drill answer is unambiguous.

Evaluation never drills: ``tasks.make`` is unchanged and ``TrainingMixture(qa_drill=0)`` (the default) makes
exactly the examples it made before.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from trtllm_dasc.evals.tasks import MIN_LENGTH, Instance
from trtllm_dasc.evals.vocab import TaskVocab

QA_TASKS = ("qa_1", "qa_2")
DRILL_TOKENS = 4 + 1          # QUERY s r ANSWER o


def drill_count(task: str, prompt_length: int, drill: int) -> int:
    """How many drill lines an example of ``task`` with ``prompt_length`` prompt tokens gets: at most
    ``drill``, and at most half of the tokens the task can spare above its shortest prompt (the rest stays
    documents, so the example keeps its facts)."""
    if task not in QA_TASKS or drill <= 0:
        return 0
    spare = prompt_length - MIN_LENGTH[task]
    return max(0, min(drill, spare // (2 * DRILL_TOKENS)))


def query_start(prompt: tuple[int, ...]) -> int:
    """Where a qa prompt's final question (QUERY ... ANSWER) starts: its last QUERY."""
    return len(prompt) - 1 - prompt[::-1].index(TaskVocab.QUERY)


def document_facts(prompt: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The (subject, relation, object) facts of a qa prompt, in order: after the first DOC, the body is
    DOC markers and 4-token facts ``s r o SEP``; the query (QUERY ... ANSWER) closes the prompt."""
    V = TaskVocab
    end = query_start(prompt)
    i = prompt.index(V.DOC)
    facts = []
    while i < end:
        if prompt[i] == V.DOC:
            i += 1
            continue
        s, r, o, sep = prompt[i:i + 4]
        if sep != V.SEP:
            raise ValueError(f"not a qa prompt: a fact at {i} does not end with SEP")
        facts.append((s, r, o))
        i += 4
    return facts


def drilled_example(instance: Instance, lines: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BOS + the prompt up to its query (the short preamble and the documents) + up to ``lines`` drill lines +
    the final query + answer + EOS, as int64 tokens, and the bool mask of the targets: each drill answer, the
    final answer and its EOS (mixture.encode's convention: the mask marks the positions whose token is a target)."""
    V = TaskVocab
    prompt = instance.prompt
    start = query_start(prompt)
    facts = document_facts(prompt)
    query = prompt[start:]
    subject, first_relation = query[1], query[2]
    pairs = Counter((s, r) for s, r, _ in facts)
    asked = {(subject, first_relation)}
    if instance.task == "qa_2":        # the second hop's fact: its subject is the first hop's object
        middle = next(o for s, r, o in facts if (s, r) == (subject, first_relation))
        asked.add((middle, query[3]))
    candidates = [f for f in facts if pairs[f[:2]] == 1 and f[:2] not in asked]
    chosen = [candidates[i] for i in rng.permutation(len(candidates))[:lines]]
    drills = [t for s, r, o in chosen for t in (V.QUERY, s, r, V.ANSWER, o)]
    tokens = np.array((V.BOS, *prompt[:start], *drills, *query, *instance.answer, V.EOS), dtype=np.int64)
    mask = np.zeros(len(tokens), dtype=bool)
    first_drill = 1 + start
    mask[first_drill + DRILL_TOKENS - 1:first_drill + len(drills):DRILL_TOKENS] = True
    mask[len(tokens) - len(instance.answer) - 1:] = True
    return tokens, mask
