"""Program task: the stack interpreter (jnp == Python), per-test reward vectors, difficulty."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import base, program, program_lang
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


@pytest.fixture(scope="module")
def task():
    return program.make_program_task()


@pytest.fixture(scope="module")
def run_all(task):
    opcode_V, const_V = program_lang.opcode_table(
        {t: task.vocab.id(t) for t in program_lang.PROGRAM_TOKENS}, task.vocab.size)

    def run(ids_A, mask_A, x):
        return program_lang.run_jnp(jnp.asarray(opcode_V)[ids_A], jnp.asarray(const_V)[ids_A],
                                    mask_A, x)

    batched = jax.jit(jax.vmap(jax.vmap(run, in_axes=(None, None, 0)), in_axes=(0, 0, None)))

    def call(programs):
        ids = np.zeros((len(programs), task.answer_len), np.int32)
        mask = np.zeros(ids.shape, bool)
        for i, p in enumerate(programs):
            ids[i, :len(p)] = task.vocab.encode(p)
            mask[i, :len(p)] = True
        return np.asarray(batched(ids, mask, jnp.arange(10, dtype=jnp.int32)))

    return call


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


def test_reward_is_the_per_test_pass_vector(task):
    problem = program.ProgramProblems(inputs=np.arange(5, dtype=np.int32),
                                      outputs=np.array([0, 1, 4, 9, 6], np.int32),
                                      target=np.zeros(task.answer_len, np.int32))
    text = "x x * <sep> x <sep> x 2 * <sep> x + <sep> x -> <eos>"
    tokens, mask = base.encode_completion(task.vocab, text, task.completion_len(6))
    ids = task.vocab.encode(text)  # a 6th answer with an id beyond the vocabulary: foreign
    tokens[len(ids) - 1:len(ids) + 2] = [task.vocab.sep_id, task.vocab.size + 3, task.vocab.eos_id]
    mask[:len(ids) + 2] = True
    rewards, valid = jax.jit(task.reward, static_argnums=3)(problem, tokens, mask, 6)
    np.testing.assert_array_equal(rewards, [[1, 1, 1, 1, 1],  # x^2
                                            [1, 1, 0, 0, 0],  # x
                                            [1, 0, 1, 0, 0],  # 2x
                                            [0, 0, 0, 0, 0],  # run-time error: valid, fails all
                                            [0, 0, 0, 0, 0],  # foreign token: invalid
                                            [0, 0, 0, 0, 0]])  # id outside the vocabulary
    np.testing.assert_array_equal(valid, [True, True, True, True, False, False])
    assert [bool(task.solved(r)) for r in rewards] == [True] + [False] * 5


def test_hard_set_has_long_targets_no_short_program_fits():
    task = program.make_program_task("hard")
    problems = task.make_problems(0, 6)
    shorts = program_lang.short_functions(5)
    for i in range(6):
        target = [task.vocab.tokens[t] for t in problems.target[i] if t]
        assert 7 <= len(target) <= 10
        xs, ys = problems.inputs[i], problems.outputs[i]
        assert [program_lang.run_py(target, int(x)) for x in xs] == ys.tolist()
        assert not np.any(np.all(shorts[:, xs] == ys, axis=1))
    assert shorts.shape == (152, 10)  # distinct results of programs of <= 5 tokens
    assert {(0,) * 10, tuple(range(10))} <= {tuple(f) for f in shorts.tolist()}


def test_equivalent_programs_are_distinct_and_equivalent():
    rng = np.random.default_rng(1)
    target = "x 3 x * + 7 -".split()
    progs = program.equivalent_programs(target, rng, 5, 12)
    assert len({tuple(p) for p in progs}) == 5 and target in progs
    table = program_lang.function_table(target)
    for p in progs:
        assert len(p) <= 12
        np.testing.assert_array_equal(program_lang.function_table(p), table)


def test_demonstrations_solve_their_problem(task):
    problems = task.make_problems(3, 3)
    for i in range(3):
        problem = base.index_problem(problems, i)
        demo = task.demonstrations(problem, np.random.default_rng(i), 3)
        answers = task.vocab.decode(demo).replace(" <eos>", "").split(" <sep> ")
        for a in answers:
            outs = [program_lang.run_py(a.split(), int(x)) for x in problem.inputs]
            assert outs == problem.outputs.tolist()


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="difficulty"):
        program.make_program_task("impossible")
    with pytest.raises(ValueError, match="answer_len"):
        program.make_program_task(max_len=11)
