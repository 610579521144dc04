"""The Task contract, checked for every task: prompts, rewards, demos, mutation prompts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import arithmetic, bandit, base, maze, program
from vpo.tasks import vocab as vocab_lib

FACTORIES = {
    "maze": maze.make_maze_task,
    "program": program.make_program_task,
    "bandit": bandit.make_bandit_task,
    "arithmetic": arithmetic.make_arithmetic_task,
}
M = 3


@pytest.fixture(scope="module", params=list(FACTORIES))
def task(request):
    return FACTORIES[request.param]()


@pytest.fixture(scope="module")
def problems(task):
    return task.make_problems(7, 4)


def _completions(task, problems, num_answers, seed=0):
    """Demonstration completions of every problem, padded to T = completion_len."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(len(problems[0])):
        demo = task.demonstrations(base.index_problem(problems, i), rng, num_answers)
        assert demo[-1] == vocab_lib.EOS
        rows.append(base.encode_completion(task.vocab, demo, task.completion_len(num_answers)))
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def _rewards(task, problems, tokens, mask, num_answers):
    if task.is_host:
        out = [task.host_reward(base.index_problem(problems, i),
                                task.vocab.decode(tokens[i][mask[i]]), num_answers)
               for i in range(len(tokens))]
        return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])
    fn = jax.jit(jax.vmap(task.reward, in_axes=(0, 0, 0, None)), static_argnums=3)
    r, m = fn(problems, tokens, mask, num_answers)
    return np.asarray(r), np.asarray(m)


def test_make_problems_is_deterministic_with_leading_n(task):
    a, b, c = task.make_problems(3, 5), task.make_problems(3, 5), task.make_problems(4, 5)
    for x, y in zip(a, b, strict=True):
        assert x.shape[0] == 5 and isinstance(x, np.ndarray)
        np.testing.assert_array_equal(x, y)
    if task.name != "bandit":  # the bandit has one fixed prompt
        assert any(not np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def test_prompt_layout(task, problems):
    prompts = jax.jit(jax.vmap(task.prompt_tokens, in_axes=(0, None)), static_argnums=1)(
        problems, M)
    assert prompts.shape == (4, task.prompt_len) and prompts.dtype == jnp.int32
    for row in np.asarray(prompts):
        body = row[row != vocab_lib.PAD]
        assert body[0] == vocab_lib.BOS and np.all(row[: len(row) - len(body)] == vocab_lib.PAD)
        assert task.vocab.tokens[body[-1]] == vocab_lib.answer_count_token(M)
    with pytest.raises(ValueError, match="num_answers"):
        task.prompt_tokens(base.index_problem(problems, 0), task.max_answers + 1)


@pytest.mark.parametrize("num_answers", [1, M])
def test_demonstrations_are_valid_scoring_and_diverse(task, problems, num_answers):
    tokens, mask = _completions(task, problems, num_answers)
    rewards_NMR, valid_NM = _rewards(task, problems, tokens, mask, num_answers)
    assert rewards_NMR.shape == (4, num_answers, task.num_rewards)
    assert valid_NM.all(), "every demonstrated answer must parse and be distinct"
    assert np.all(rewards_NMR @ task.eval_weights_R > 0)
    assert np.all((rewards_NMR >= 0) & (rewards_NMR <= 1))


def test_invalid_completion_scores_zero(task, problems):
    T = task.completion_len(M)
    tokens = np.full((4, T), vocab_lib.SEP, np.int32)  # only empty answers
    rewards_NMR, valid_NM = _rewards(task, problems, tokens, np.ones((4, T), bool), M)
    assert not valid_NM.any() and np.all(rewards_NMR == 0)


def test_mutation_prompt_has_static_length_and_shows_parents(task, problems):
    Q, A, R = 2, task.answer_len, task.num_rewards
    demo = task.demonstrations(base.index_problem(problems, 0), np.random.default_rng(0), 1)
    answer = demo[:-1]
    parents_QA = np.zeros((Q, A), np.int32)
    parents_QA[0, :len(answer)] = answer
    pmask_QA = parents_QA != 0
    rewards_QR = np.zeros((Q, R), np.float32)
    rewards_QR[0] = 0.5
    fn = jax.jit(jax.vmap(task.mutation_prompt, in_axes=(0, None, None, None, None)),
                 static_argnums=4)
    out = np.asarray(fn(problems, parents_QA, pmask_QA, rewards_QR, M))
    assert out.shape == (4, task.mutation_prompt_len(Q))
    words = task.vocab.decode(out[0]).split()
    assert words.count(vocab_lib.PARENT) == 1  # the empty second parent is left out
    shown = " ".join(task.vocab.tokens[i] for i in answer)
    scores = " ".join(["q5"] * R)
    assert f"{vocab_lib.PARENT} {shown} {vocab_lib.SCORE} {scores}" in " ".join(words)
    assert words[-1] == vocab_lib.answer_count_token(M) and vocab_lib.EVOLVE in words


def test_solved_is_a_jittable_predicate(task):
    ones = jnp.ones((task.num_rewards,), jnp.float32)
    assert bool(jax.jit(task.solved)(ones)) and not bool(jax.jit(task.solved)(0 * ones))


def test_completion_len_and_contract_validation(task):
    assert task.completion_len(M) == M * (task.answer_len + 1)
    fields = {f: getattr(task, f) for f in task.__dataclass_fields__}
    with pytest.raises(ValueError, match="eval_weights_R"):
        base.Task(**{**fields, "eval_weights_R": np.ones(task.num_rewards + 1)})
    with pytest.raises(ValueError, match="exactly one"):
        base.Task(**{**fields, "reward": None, "host_reward": None})


def test_mutation_demonstrations_show_real_scores_and_children_beat_parents(task):
    """Decode the SFT mutation demonstrations back from tokens and re-score every shown parent
    and every child on its own with the task's reward: the prompt's score tokens are the
    parent's real rewards (tenths), and each child beats each parent on w*ᵀr."""
    from vpo.sft import mutation_demonstration_set

    if task.mutation_demonstrations is None:
        with pytest.raises(ValueError, match="mutation_fraction=0"):
            mutation_demonstration_set(task, 2, 2, 2, 0)
        return
    K, m, n, seed = 2, 2, 6, 5
    demos, stats = mutation_demonstration_set(task, n, m, K, seed)
    assert demos["prompt_BP"].shape == (n, task.mutation_prompt_len(K))
    assert 1 <= stats["mean_parents"] <= K
    assert stats["kept_fraction"] == 1.0  # so row i is problem i of make_problems(seed, n)
    problems = task.make_problems(seed, n)
    score = jax.jit(lambda p, c, mk: task.reward(p, c, mk, 1))
    T1 = task.completion_len(1)

    def fitness(i, words):
        c, mk = base.encode_completion(task.vocab, task.vocab.encode(words) + [vocab_lib.EOS], T1)
        r, v = score(base.index_problem(problems, i), c, mk)
        assert bool(v[0])
        return np.asarray(r[0]), float(np.asarray(r[0]) @ task.eval_weights_R)

    for i in range(n):
        p = demos["prompt_BP"][i]
        words = task.vocab.decode(p[demos["prompt_mask_BP"][i]]).split()
        assert words[:2] == [task.vocab.tokens[vocab_lib.BOS], vocab_lib.EVOLVE]
        assert words[-1] == vocab_lib.answer_count_token(m)
        parents = " ".join(words).split(f" {vocab_lib.PARENT} ")[1:]
        assert 1 <= len(parents) <= K
        t = demos["target_BT"][i][demos["target_mask_BT"][i]]
        children = task.vocab.decode(t).replace(vocab_lib.SPECIAL_TOKENS[vocab_lib.EOS], "")
        children = [c.split() for c in children.split(vocab_lib.SPECIAL_TOKENS[vocab_lib.SEP])]
        assert len(children) == m and len({tuple(c) for c in children}) == m
        worst_child = min(fitness(i, c)[1] for c in children)
        for par in parents:
            answer, shown = par.split(f" {vocab_lib.SCORE} ")
            r_R, f = fitness(i, answer.split())
            tenths = [int(q[1:]) for q in shown.split()[:task.num_rewards]]
            assert tenths == np.round(10 * r_R).astype(int).tolist()
            assert worst_child > f
