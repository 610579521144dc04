"""Program task: the stack interpreter (jnp == Python), the in-graph reward equals the host score,
per-test reward vectors, demonstrations, mutation demonstrations, difficulty presets."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import program, program_lang
from vpo.tasks.program_lang import FAIL

HAND = {  # program -> outputs on x = 0..4
    "x 3 +": [3, 4, 5, 6, 7],
    "x dup *": [0, 1, 4, 9, 6],
    "3 4 -": [9] * 5,  # (3 - 4) mod 10
    "x 2 swap -": [2, 1, 0, 9, 8],  # 2 - x
    "x x x * *": [0, 1, 8, 7, 4],
    "x 1 2": [2] * 5,  # the result is the top of the stack
    "x +": [FAIL] * 5,  # pop from a short stack
    "swap": [FAIL] * 5,
    "dup": [FAIL] * 5,
    "": [FAIL] * 5,  # an empty program leaves an empty stack
    "x x x x x x x": [FAIL] * 5,  # 7 pushes overflow the 6-deep stack
    "x x x x x x + + + + +": [0, 6, 2, 8, 4],  # 6 deep is fine: 6x mod 10
    "x -> 3": [FAIL] * 5,  # not a program token
}
ERRORS = ["x +", "swap", "dup", "x x x x x x x", "+ x", "x swap"]  # well formed, FAIL on run


@pytest.fixture(scope="module")
def task():
    return program.make_program_task()


@pytest.fixture(scope="module")
def records(task):
    return task.make_problems(3, 4)


def _ids(task, programs):
    """(symbols_NA int32, mask_NA bool) of programs given as word lists (all symbols)."""
    ids = np.zeros((len(programs), task.answer_len), np.int32)
    mask = np.zeros(ids.shape, bool)
    for i, p in enumerate(programs):
        ids[i, :len(p)] = [task.symbols.index(w) for w in p]
        mask[i, :len(p)] = True
    return ids, mask


@pytest.fixture(scope="module")
def run_all(task):
    """Outputs [N, 10] of programs on x = 0..9 via `run_jnp`; a foreign word gets id S (BAD)."""
    S = len(task.symbols)
    opcode_V, const_V = program_lang.opcode_table({t: i for i, t in enumerate(task.symbols)},
                                                  S + 1)

    def run(ids_A, mask_A, x):
        return program_lang.run_jnp(jnp.asarray(opcode_V)[ids_A], jnp.asarray(const_V)[ids_A],
                                    mask_A, x)

    batched = jax.jit(jax.vmap(jax.vmap(run, in_axes=(None, None, 0)), in_axes=(0, 0, None)))

    def call(programs):
        ids = np.zeros((len(programs), task.answer_len), np.int32)
        mask = np.zeros(ids.shape, bool)
        for i, p in enumerate(programs):
            ids[i, :len(p)] = [task.symbols.index(w) if w in task.symbols else S for w in p]
            mask[i, :len(p)] = True
        return np.asarray(batched(ids, mask, jnp.arange(10, dtype=jnp.int32)))

    return call


@pytest.fixture(scope="module")
def graph_reward(task):
    """symbol_reward over a batch of (problem, answer) pairs, jitted and vmapped."""
    fn = jax.jit(jax.vmap(task.symbol_reward))

    def call(records, programs):
        ids, mask = _ids(task, programs)
        return np.asarray(fn(task.arrays(records), ids, mask))

    return call


def test_records_are_json_and_deterministic(task, records):
    assert json.loads(json.dumps(records)) == records
    assert task.make_problems(3, 4) == records
    assert task.make_problems(4, 4) != records
    for r in records:
        assert len(r["inputs"]) == len(r["outputs"]) == 5
        outs = [program_lang.run_py(r["target"].split(), x) for x in r["inputs"]]
        assert outs == r["outputs"]


def test_statement_words_are_task_words(task, records):
    text = task.statement(records[0])
    assert text == text.strip()
    pairs = zip(records[0]["inputs"], records[0]["outputs"], strict=True)
    assert "Examples: " + " ; ".join(f"{x} -> {y}" for x, y in pairs) in text
    for t in (task, program.make_program_task("medium", num_tests=10)):
        for r in t.make_problems(0, 8):
            assert set(t.statement(r).split()) <= set(t.words)
        assert set(t.symbols) <= set(t.words)


def test_arrays(task, records):
    arrays = task.arrays(records)
    assert arrays.inputs.shape == arrays.outputs.shape == (4, 5)
    assert arrays.inputs.dtype == arrays.outputs.dtype == np.int32
    np.testing.assert_array_equal(arrays.outputs[2], records[2]["outputs"])


def test_hand_written_programs(run_all):
    programs = [p.split() for p in HAND]
    got = run_all(programs)
    for prog, row in zip(programs, got, strict=True):
        want = HAND[" ".join(prog)]
        assert [program_lang.run_py(prog, x) for x in range(5)] == want, prog
        assert row[:5].tolist() == want, prog


def test_jnp_interpreter_equals_reference_on_random_token_strings(run_all):
    rng = np.random.default_rng(0)
    tokens = list(program_lang.PROGRAM_TOKENS) + ["->"]
    programs = [list(rng.choice(tokens, size=rng.integers(0, 13))) for _ in range(150)]
    programs += [program_lang.sample_program(rng, int(rng.integers(3, 11))) for _ in range(50)]
    got = run_all(programs)
    want = np.array([[program_lang.run_py(p, x) for x in range(10)] for p in programs])
    np.testing.assert_array_equal(got, want)


def test_symbol_reward_equals_score(task, records, graph_reward):
    rng = np.random.default_rng(1)
    pairs = [(records[i % 4], [str(w) for w in rng.choice(task.symbols, size=rng.integers(1, 13))])
             for i in range(60)]
    pairs += [(records[i % 4], p.split()) for i, p in enumerate(ERRORS)]
    pairs += [(r, r["target"].split()) for r in records]
    pairs += [(r, d.split()) for i, r in enumerate(records)
              for d in task.demonstrations(r, np.random.default_rng(i), 2)]
    recs, programs = [p[0] for p in pairs], [p[1] for p in pairs]
    got = graph_reward(recs, programs)
    rewards, valid = task.score(recs, [[" ".join(p)] for p in programs])
    assert valid.all()
    np.testing.assert_array_equal(got, rewards[:, 0])
    assert got.dtype == np.float32 and got.shape == (len(programs), 5)
    assert got[-12:].all()  # targets and demonstrations pass every test
    assert not got[60:60 + len(ERRORS)].any()  # run-time errors fail every test


def test_score_is_the_per_test_pass_vector(task, graph_reward):
    record = {"inputs": [0, 1, 2, 3, 4], "outputs": [0, 1, 4, 9, 6], "target": "x x *"}
    answers = ["x x *", "x", "x 2 *", "x +", "x ->", "x dup *", "x  x\n*", None, "",
               " ".join(["x"] * 13), "x <answer 1>", "X", "x 2 * 1 *"]
    rewards, valid = task.score([record], [answers])
    np.testing.assert_array_equal(rewards[0], [[1, 1, 1, 1, 1],  # x^2
                                               [1, 1, 0, 0, 0],  # x
                                               [1, 0, 1, 0, 0],  # 2x
                                               [0, 0, 0, 0, 0],  # run-time error: fails all
                                               [0, 0, 0, 0, 0],  # foreign word: invalid
                                               [1, 1, 1, 1, 1],  # x^2 again, other words
                                               [0, 0, 0, 0, 0],  # duplicate of the first
                                               [0, 0, 0, 0, 0],  # missing
                                               [0, 0, 0, 0, 0],  # empty
                                               [0, 0, 0, 0, 0],  # 13 > A = 12 words
                                               [0, 0, 0, 0, 0],  # a tag inside the answer
                                               [0, 0, 0, 0, 0],  # words are case sensitive
                                               [1, 0, 1, 0, 0]])  # 2x, other words
    np.testing.assert_array_equal(valid[0], [True, True, True, True, False, True, False, False,
                                             False, False, False, False, True])
    solved = [True] + [False] * 4 + [True] + [False] * 7
    assert [bool(task.solved(r)) for r in rewards[0]] == solved
    got = graph_reward([record] * 4, [a.split() for a in answers[:4]])
    np.testing.assert_array_equal(got, rewards[0, :4])
    assert bool(jax.jit(task.solved)(jnp.asarray(got[0])))


def test_hard_set_has_long_targets_no_short_program_fits():
    task = program.make_program_task("hard")
    assert task.name == "program-hard"
    records = task.make_problems(0, 6)
    shorts = program_lang.short_functions(5)
    for r in records:
        target = r["target"].split()
        assert 7 <= len(target) <= 10
        xs, ys = np.array(r["inputs"]), np.array(r["outputs"])
        assert [program_lang.run_py(target, int(x)) for x in xs] == r["outputs"]
        assert not np.any(np.all(shorts[:, xs] == ys, axis=1))
        assert set(task.statement(r).split()) <= set(task.words)
    assert shorts.shape == (152, 10)  # distinct results of programs of <= 5 tokens
    assert {(0,) * 10, tuple(range(10))} <= {tuple(f) for f in shorts.tolist()}


def test_difficulty_presets_and_explicit_lengths():
    for difficulty, (lo, hi, _) in program.DIFFICULTIES.items():
        if difficulty == "hard":
            continue  # above
        task = program.make_program_task(difficulty, num_tests=3)
        assert task.reward_names == ("test_0", "test_1", "test_2")
        np.testing.assert_allclose(task.eval_weights_R, [1 / 3] * 3)
        for r in task.make_problems(1, 5):
            assert lo <= len(r["target"].split()) <= hi
    task = program.make_program_task(min_len=4, max_len=4, answer_len=8)
    assert task.answer_len == 8
    assert all(len(r["target"].split()) == 4 for r in task.make_problems(2, 5))


def test_equivalent_programs_are_distinct_and_equivalent():
    rng = np.random.default_rng(1)
    target = ["x", "3", "x", "*", "+", "7", "-"]
    progs = program.equivalent_programs(target, rng, 5, 12)
    assert len({tuple(p) for p in progs}) == 5 and target in progs
    table = program_lang.function_table(target)
    for p in progs:
        assert len(p) <= 12
        np.testing.assert_array_equal(program_lang.function_table(p), table)


def test_demonstrations_solve_their_problem(task, records):
    for i, r in enumerate(records):
        demos = task.demonstrations(r, np.random.default_rng(i), 3)
        assert len(demos) == 3 and all(isinstance(d, str) for d in demos)
        rewards, valid = task.score([r], [demos])
        assert valid.all() and rewards.all()


def test_mutation_demonstrations_children_beat_parents(task, records):
    for i, r in enumerate(records):
        parents, children = task.mutation_demonstrations(r, np.random.default_rng(i), 3, 2)
        assert 1 <= len(parents) <= 3 and len(children) == 2
        assert not set(parents) & set(children)
        rewards_c, valid_c = task.score([r], [children])
        rewards_p, valid_p = task.score([r], [parents])
        assert valid_c.all() and valid_p.all()  # well formed and distinct
        assert rewards_c.all()
        assert np.all(rewards_p.mean(-1) < 1.0)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="difficulty"):
        program.make_program_task("impossible")
    with pytest.raises(ValueError, match="answer_len"):
        program.make_program_task(max_len=11)
    with pytest.raises(ValueError, match="num_tests"):
        program.make_program_task(num_tests=11)
