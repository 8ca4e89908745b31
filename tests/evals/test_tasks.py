"""The synthetic long-context tasks: determinism, prompt shape, answers a brute-force reader recovers from
the prompt alone, scoring, the training mixture and its seed space, and clear errors on bad input.

The solvers below read prompts by the task grammar in the tasks module's docstring only; they share no
code with the generators, so a generator that writes an ambiguous or wrong answer fails here."""
from collections import Counter, defaultdict
from functools import cache

import numpy as np
import pytest

from trtllm_dasc.evals import (ANSWER_LENGTH, EVAL_SEED_LIMIT, MIN_LENGTH, SCORING, TASKS, TRAIN_SEED_BASE,
                               TaskVocab, TrainingMixture, answer_tokens, encode, make, score)

V = TaskVocab
LENGTHS = (256, 1024, 4096)


@cache
def instance(task, length, seed=0, vocab_size=512):
    return make(task, length, seed, TaskVocab(vocab_size))


# ---- brute-force solvers, written from the task grammar -------------------------------------------------
def split_query(prompt):
    """(body, query tokens between the last QUERY and the closing ANSWER)."""
    assert prompt[-1] == V.ANSWER
    q = len(prompt) - 1 - prompt[::-1].index(V.QUERY)
    return prompt[:q], prompt[q + 1:-1]


def split_on(tokens, marker):
    parts, current = [], None
    for t in tokens:
        if t == marker:
            if current is not None:
                parts.append(tuple(current))
            current = []
        elif current is not None:
            current.append(t)
    return parts + ([tuple(current)] if current is not None else [])


def needles_of(prompt):
    """key -> its values in prompt order, from every  KEY key VAL value SEP  record."""
    body, _ = split_query(prompt)
    values_of = defaultdict(list)              # key -> values in prompt order
    i = 0
    while i < len(body):
        if body[i] == V.KEY:
            val, end = body.index(V.VAL, i), body.index(V.SEP, i)
            values_of[tuple(body[i + 1:val])].append(tuple(body[val + 1:end]))
            i = end + 1
        else:
            i += 1
    return values_of


def solve_niah(prompt):
    _, query = split_query(prompt)
    values_of = needles_of(prompt)
    if query[0] == V.ALL:
        (key,) = split_on(query[1:], V.KEY)
        assert len(values_of[key]) > 1
        return [t for v in values_of[key] for t in v]
    answer = []
    for key in split_on(query, V.KEY):
        assert len(values_of[key]) == 1, "a queried key must occur exactly once"
        answer += values_of[key][0]
    return answer


def solve_vt(prompt):
    body, query = split_query(prompt)
    assert query[:2] == (V.VAR, V.EQ)
    defined = {}                               # name -> ("digits", tuple) | ("var", name)
    i = 0
    while i < len(body):
        if body[i] == V.VAR and body[i + 2] == V.EQ:
            end = body.index(V.SEP, i)
            rhs = body[i + 3:end]
            assert body[i + 1] not in defined, "a variable is assigned once"
            defined[body[i + 1]] = ("var", rhs[1]) if rhs[0] == V.VAR else ("digits", rhs)
            i = end + 1
        else:
            i += 1

    def value(name):
        kind, x = defined[name]
        return value(x) if kind == "var" else x
    return {name for name in defined if value(name) == query[2:]}


def solve_top(prompt, marker, top):
    body, query = split_query(prompt)
    assert query == (marker,) and body[0] == V.LIST and body[-1] == V.SEP
    counts = Counter(body[1:-1]).most_common()
    assert counts[top - 1][1] > counts[top][1], "the top words must be unambiguous"
    return {w for w, _ in counts[:top]}, counts


def solve_qa(prompt):
    body, query = split_query(prompt)
    objects = defaultdict(list)
    for doc in split_on(body, V.DOC):          # split_on drops the words before the first DOC
        for fact in split_on((V.SEP,) + doc, V.SEP):
            if fact:
                s, r, o = fact
                objects[(s, r)].append(o)
    subject = query[0]
    for relation in query[1:]:
        assert len(objects[(subject, relation)]) == 1, "an asked (subject, relation) occurs exactly once"
        subject = objects[(subject, relation)][0]
    return [subject]


# ---- determinism ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_same_arguments_same_instance_other_seed_other_prompt(task):
    np.random.seed(1)
    a = make(task, 512, 7, TaskVocab(512))
    np.random.seed(2)                           # the global state must not leak in
    assert make(task, 512, 7, TaskVocab(512)) == a
    assert make(task, 512, 8, TaskVocab(512)).prompt != a.prompt
    assert make(task, 513, 7, TaskVocab(512)).prompt != a.prompt[:-1] + (V.ANSWER,)


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_2"])
def test_depth_moves_only_the_needle(task):
    shallow, deep = make(task, 1024, 3, depth=0.0), make(task, 1024, 3, depth=1.0)
    assert shallow.answer == deep.answer and shallow.prompt != deep.prompt
    assert Counter(shallow.prompt) == Counter(deep.prompt)


def find(tokens, run):
    run = tuple(run)
    return next(i for i in range(len(tokens)) if tuple(tokens[i:i + len(run)]) == run)


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_depth_places_the_needle(depth):
    inst = make("niah_single_2", 2048, 0, depth=depth)
    at = inst.prompt.index(V.KEY)
    haystack = 2048 - 5 - 12                    # prompt less the query and the needle
    assert abs(at - depth * haystack) <= 16     # within a sentence of the requested depth
    assert inst.depth == depth


@pytest.mark.parametrize("task", ["niah_multikey_1", "niah_multiquery", "vt", "qa_1", "qa_2"])
def test_depth_places_the_first_asked_record(task):
    for depth in (0.0, 0.5, 1.0):
        body, query = split_query(make(task, 2048, 1, depth=depth).prompt)
        if task == "vt":                        # the statement giving the queried value
            at = find(body, query[1:])
        elif task.startswith("qa"):             # the fact of the asked subject and first relation
            at = find(body, query[:2])
        else:                                   # the needle of the first queried key
            at = find(body, split_on(query, V.KEY)[0])
        assert abs(at - depth * len(body)) <= 64, (depth, at, len(body))


# ---- prompt shape ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("task", TASKS)
def test_prompt_shape(task, length):
    inst = instance(task, length)
    assert length - 16 <= len(inst.prompt) <= length
    assert all(0 <= t < 512 for t in inst.prompt + inst.answer)
    assert inst.prompt[-1] == V.ANSWER and V.ANSWER not in inst.prompt[:-1]
    assert V.BOS not in inst.prompt and V.PAD not in inst.prompt and V.EOS not in inst.prompt
    assert len(inst.answer) == ANSWER_LENGTH[task] > 0
    assert not any(TaskVocab().is_special(t) for t in inst.answer)
    assert answer_tokens(inst) == len(inst.answer) + 1
    assert inst.scoring == SCORING[task] and inst.model_input == (V.BOS,) + inst.prompt


# ---- answers recoverable from the prompt ----------------------------------------------------------------
def check_recoverable(inst):
    task, prompt = inst.task, inst.prompt
    if task.startswith("niah"):
        assert tuple(solve_niah(prompt)) == inst.answer   # multivalue: values in prompt order
        needles = needles_of(prompt)
        values = [v for vs in needles.values() for v in vs]
        assert len(set(values)) == len(values), "values are distinct"
        repeated = [k for k, vs in needles.items() if len(vs) > 1]
        assert len(repeated) == (task == "niah_multivalue"), "only the multivalue key repeats"
    elif task == "vt":
        assert solve_vt(prompt) == set(inst.answer) and len(set(inst.answer)) == 5
    elif task == "cwe":
        top, counts = solve_top(prompt, V.COMMON, 10)
        assert top == set(inst.answer)
        assert counts[9][1] >= 2 * counts[10][1], "common words are clearly more common"
    elif task == "fwe":
        top, counts = solve_top(prompt, V.FREQ, 3)
        assert top == set(inst.answer)
        assert [c for w, c in counts[:3]] == sorted((dict(counts)[w] for w in inst.answer), reverse=True)
    else:
        assert tuple(solve_qa(prompt)) == inst.answer


@pytest.mark.parametrize("task", TASKS)
def test_answer_recoverable_from_prompt(task):
    for length in (MIN_LENGTH[task],) + LENGTHS:
        check_recoverable(instance(task, length))
    for seed in range(1, 6):
        check_recoverable(instance(task, 512, seed))
    for seed in range(1, 41):                   # short prompts are where ties and collisions happen
        check_recoverable(make(task, MIN_LENGTH[task], seed))
    for vocab_size in (128, 1024):
        check_recoverable(instance(task, 2048, 0, vocab_size))


# ---- scoring --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_score_perfect_empty_and_eos(task):
    inst = instance(task, 256)
    assert score(inst, list(inst.answer)) == 1.0
    assert score(inst, list(inst.answer) + [V.EOS, 99, 98]) == 1.0
    assert score(inst, np.array(inst.answer)) == 1.0
    assert score(inst, []) == 0.0
    assert score(inst, [V.EOS] + list(inst.answer)) == 0.0


@pytest.mark.parametrize("task", [t for t in TASKS if SCORING[t] == "exact"])
def test_exact_score_wrong_token_is_zero(task):
    inst = instance(task, 256)
    for i in (0, len(inst.answer) - 1):
        wrong = list(inst.answer)
        wrong[i] = V.EOS + 40 if wrong[i] != V.EOS + 40 else V.EOS + 41
        assert score(inst, wrong) == 0.0


@pytest.mark.parametrize("task", [t for t in TASKS if SCORING[t] != "exact"])
def test_set_score_counts_items_in_any_order(task):
    inst = instance(task, 1024)
    size = 7 if SCORING[task] == "recall" else 1
    items = [list(inst.answer[i:i + size]) for i in range(0, len(inst.answer), size)]
    filler = [TaskVocab().digit(0) if size == 1 else TaskVocab().words[0]] * size  # never an item
    assert filler not in items
    half = len(items) // 2
    assert score(inst, [t for item in items[:half] for t in item]) == pytest.approx(half / len(items))
    assert score(inst, [t for item in items[::-1] for t in item]) == 1.0
    assert score(inst, [t for item in [filler] + items[1:] for t in item]) == pytest.approx(1 - 1 / len(items))
    if task == "cwe":
        assert score(inst, list(inst.answer[:5])) == 0.5


def test_score_ignores_tokens_past_the_answer_length():
    inst = instance("cwe", 1024)
    spam = [w for w in TaskVocab().words if w not in inst.answer][:10] + list(inst.answer)
    assert score(inst, spam) == 0.0              # listing every word does not win


# ---- training mixture -----------------------------------------------------------------------------------
def test_mixture_sample_is_framed_and_masked_on_the_answer():
    mix = TrainingMixture(TaskVocab(512), min_length=256, max_length=640, seed=3)
    for _ in range(20):
        tokens, mask = mix.sample()
        assert tokens.dtype == np.int64 and mask.dtype == bool and tokens.shape == mask.shape
        assert 256 <= len(tokens) <= 640 and tokens[0] == V.BOS and tokens[-1] == V.EOS
        first = int(np.argmax(mask))
        assert mask[first:].all() and not mask[:first].any()
        assert tokens[first - 1] == V.ANSWER and V.EOS not in tokens[:-1]
        assert mask.sum() - 1 in ANSWER_LENGTH.values()


def test_mixture_sample_is_encode_of_draw():
    mix = TrainingMixture(min_length=300, max_length=400)
    inst = mix.draw(np.random.default_rng(5))
    tokens, mask = mix.sample(np.random.default_rng(5))
    assert np.array_equal(tokens, encode(inst)[0]) and np.array_equal(mask, encode(inst)[1])
    assert list(tokens[mask]) == list(inst.answer) + [V.EOS]


def test_mixture_batch_shapes_and_padding():
    mix = TrainingMixture(min_length=256, max_length=2048)
    tokens, mask = mix.batch(6, 600, np.random.default_rng(0))
    assert tokens.shape == mask.shape == (6, 600) and tokens.dtype == np.int64 and mask.dtype == bool
    for row, m in zip(tokens, mask):
        used = int(np.flatnonzero(row == V.EOS)[-1]) + 1
        assert row[0] == V.BOS and 256 <= used <= 600
        assert (row[used:] == V.PAD).all() and not m[used:].any() and m[used - 1]
        assert row[np.argmax(m) - 1] == V.ANSWER


def test_mixture_batch_shorter_than_min_length_fills_every_row():
    mix = TrainingMixture(min_length=1024, max_length=4096)     # a curriculum starting at 256 tokens
    tokens, mask = mix.batch(4, 256, np.random.default_rng(1))
    assert tokens.shape == (4, 256) and (tokens[:, -1] == V.EOS).all() and mask[:, -1].all()


class LowestDraws(np.random.Generator):
    """Every integer draw returns the lowest value allowed: the mixture's smallest reachable seed."""
    def __init__(self):
        super().__init__(np.random.PCG64(0))

    def integers(self, low, high=None, *args, **kwargs):
        return low if high is not None else 0


def test_mixture_never_reaches_an_evaluation_seed():
    assert TRAIN_SEED_BASE >= EVAL_SEED_LIMIT
    mix = TrainingMixture(min_length=256, max_length=300)
    assert mix.draw(LowestDraws()).seed >= EVAL_SEED_LIMIT
    rng = np.random.default_rng(0)
    drawn = [mix.draw(rng) for _ in range(200)]
    assert min(i.seed for i in drawn) >= EVAL_SEED_LIMIT
    assert {i.task for i in drawn} == set(TASKS)


# ---- bad input ------------------------------------------------------------------------------------------
def raises_one_line(fn, *needles):
    with pytest.raises(ValueError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    for n in needles:
        assert n in message, message


def test_bad_input_gets_a_clear_error():
    raises_one_line(lambda: make("niah_single_4", 256, 0), "unknown task 'niah_single_4'", "niah_single_1")
    raises_one_line(lambda: make("niah_multikey_3", 100, 0), "too short", "niah_multikey_3", "128")
    raises_one_line(lambda: make("cwe", 127, 0), "too short")
    raises_one_line(lambda: TaskVocab(100), "vocab_size must be at least 128", "100")
    raises_one_line(lambda: make("vt", 256, -1), "seed must be a non-negative integer")
    raises_one_line(lambda: make("vt", 256, 0, depth=1.5), "depth must be a number in [0, 1]")
    raises_one_line(lambda: make("vt", 256.0, 0), "length must be an integer")
    raises_one_line(lambda: TrainingMixture(min_length=64), "min_length 64 is too short")
    raises_one_line(lambda: TrainingMixture(tasks=("qa_3",)), "unknown task 'qa_3'")
    raises_one_line(lambda: TrainingMixture().batch(2, 100), "batch length 100 is too short", "158")
    for task in TASKS:                          # the stated minimum is the real one
        make(task, MIN_LENGTH[task], 0)
        with pytest.raises(ValueError):
            make(task, MIN_LENGTH[task] - 1, 0)


def test_vocab_layout_is_disjoint_and_sized():
    for size in (128, 512, 1000):
        v = TaskVocab(size)
        assert list(v.specials) + list(v.digits) + list(v.words) == list(range(size))
        assert v.number_tokens(907) == (v.digit(9), v.digit(0), v.digit(7))
    assert TaskVocab().render([V.KEY, TaskVocab().digit(3), 50]) == "KEY 3 w50"
