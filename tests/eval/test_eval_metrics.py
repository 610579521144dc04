"""Evaluation metrics against brute force and hand-computed values; budget-fair pools; plots."""

import itertools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from vpo.eval import metrics as eval_metrics
from vpo.eval import plots
from vpo.tasks import bandit


def _brute_pass(correct, k):
    subsets = list(itertools.combinations(range(len(correct)), k))
    return np.mean([any(correct[i] for i in s) for s in subsets])


def _brute_best(scores, k):
    subsets = list(itertools.combinations(range(len(scores)), k))
    return np.mean([max(scores[i] for i in s) for s in subsets])


def test_pass_at_k_equals_enumeration_over_all_k_subsets():
    rng = np.random.default_rng(0)
    for n in (1, 4, 7):
        correct_BN = rng.random((6, n)) < rng.random((6, 1))
        for k in range(1, n + 1):
            got = np.asarray(eval_metrics.pass_at_k(correct_BN, k))
            want = [_brute_pass(row, k) for row in correct_BN]
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"n={n} k={k}")


def test_pass_at_k_reference_values():
    correct = np.zeros((3, 10), bool)
    correct[0, :3] = True  # n = 10, c = 3, k = 4: 1 - C(7,4)/C(10,4) = 0.8333 (Chen et al. 2021)
    correct[1, :7] = True  # n - c = 3 < k: certain
    got = eval_metrics.pass_at_k(correct, 4)
    np.testing.assert_allclose(got, [1 - 35 / 210, 1.0, 0.0], atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(0, 1, width=32), min_size=1, max_size=7), st.data())
def test_best_at_k_equals_enumeration_over_all_k_subsets(scores, data):
    k = data.draw(st.integers(1, len(scores)))
    got = float(eval_metrics.best_at_k(np.array([scores], np.float32), k)[0])
    assert got == pytest.approx(_brute_best(scores, k), abs=1e-6)


def test_best_at_k_weights_are_a_distribution_even_for_large_n():
    for n, k in [(5, 1), (5, 5), (10_000, 50), (3_000, 3_000)]:
        w = eval_metrics.best_at_k_weights(n, k)
        assert np.all(np.isfinite(w)) and w.sum() == pytest.approx(1.0)
        assert np.all(w[: k - 1] == 0)
    np.testing.assert_allclose(eval_metrics.best_at_k_weights(4, 2), [0, 1 / 6, 2 / 6, 3 / 6])


@pytest.mark.parametrize("k", [0, 4, 2.0])
def test_bad_k_names_the_argument(k):
    with pytest.raises(ValueError, match="k="):
        eval_metrics.best_at_k(np.zeros((1, 3)), k)


def test_pool_shape_metrics_by_hand():
    r_BNR = jnp.array([[[1, 0], [0, 1], [0.6, 0.6], [0.5, 0.5], [0.9, 0.9]]], jnp.float32)
    valid_BN = jnp.array([[True, True, True, True, False]])
    # pairs: |A-B| = 2, |A-C| = |B-C| = |A-D| = |B-D| = 1, |C-D| = 0.2 -> mean 6.2 / 6
    np.testing.assert_allclose(eval_metrics.reward_diversity(r_BNR, valid_BN), [6.2 / 6], atol=1e-6)
    np.testing.assert_allclose(eval_metrics.pareto_fraction(r_BNR, valid_BN), [0.75])  # D dominated
    np.testing.assert_allclose(eval_metrics.pareto_fraction(r_BNR, ~valid_BN), [1.0])
    none_BN = jnp.zeros_like(valid_BN)
    assert float(eval_metrics.reward_diversity(r_BNR, none_BN)[0]) == 0.0
    assert float(eval_metrics.pareto_fraction(r_BNR, none_BN)[0]) == 0.0


def test_expected_max_pool_reuses_the_vpo_set_score():
    r_BNR = jnp.array([[[1, 0], [0, 1], [0, 0]], [[0.6, 0.6], [0, 0], [1, 1]]], jnp.float32)
    valid_BN = jnp.array([[True, True, False], [True, False, False]])
    got = eval_metrics.expected_max_pool(r_BNR, valid_BN, jax.random.key(0), num_weights=20_000)
    np.testing.assert_allclose(got, [0.75, 0.6], atol=0.01)
    empty = eval_metrics.expected_max_pool(r_BNR, jnp.zeros_like(valid_BN), jax.random.key(0))
    np.testing.assert_array_equal(empty, [0.0, 0.0])


def test_distinct_solutions_counts_valid_token_sequences():
    answers_BNA = jnp.array([[[4, 5], [4, 5], [4, 0], [6, 6], [4, 5]]])
    mask_BNA = answers_BNA != 0
    valid_BN = jnp.array([[True, True, True, False, True]])
    assert int(eval_metrics.distinct_solutions(answers_BNA, mask_BNA, valid_BN)[0]) == 2


def test_entropy_stats_match_numpy_on_the_masked_tokens():
    rng = np.random.default_rng(0)
    e_BT = rng.random((4, 9)).astype(np.float32)
    mask_BT = rng.random((4, 9)) < 0.6
    stats = jax.jit(eval_metrics.entropy_stats)(e_BT, mask_BT)
    kept = e_BT[mask_BT]
    assert float(stats["mean"]) == pytest.approx(kept.mean(), abs=1e-6)
    assert float(stats["std"]) == pytest.approx(kept.std(), abs=1e-6)
    for q in (0.1, 0.5, 0.9):
        assert float(stats[f"q{round(100 * q)}"]) == pytest.approx(np.quantile(kept, q), abs=1e-6)
    empty = eval_metrics.entropy_stats(e_BT, np.zeros_like(mask_BT))
    assert all(float(v) == 0.0 for v in empty.values())


def test_budget_fair_pool_counts_every_slot_as_a_candidate():
    task = bandit.make_bandit_task()
    # One problem, G = 2 generations of M = 3 answers: (A, B, invalid) and (C, invalid, invalid).
    rewards_BGMR = jnp.array([[[[1, 0], [0, 1], [0, 0]], [[0.6, 0.6], [0, 0], [0, 0]]]])
    mask_BGM = jnp.array([[[True, True, False], [True, False, False]]])
    pool = eval_metrics.pool_candidates(rewards_BGMR, mask_BGM, task.eval_weights_R, task.solved)
    assert pool.scores_BN.shape == (1, 6)  # 2 generations x 3 answers = 6 candidates
    np.testing.assert_allclose(pool.scores_BN, [[0.5, 0.5, 0, 0.6, 0, 0]], atol=1e-6)
    np.testing.assert_array_equal(pool.correct_BN, [[False, False, False, True, False, False]])
    # The same candidates from 6 single-answer generations form the same pool.
    single = eval_metrics.pool_candidates(rewards_BGMR.reshape(1, 6, 1, 2),
                                        mask_BGM.reshape(1, 6, 1), task.eval_weights_R,
                                        task.solved)
    for a, b in zip(pool, single, strict=True):
        np.testing.assert_array_equal(a, b)
    # best@3 over 6 candidates: invalid slots count (they consumed budget) and score 0.
    want = _brute_best([0.5, 0.5, 0, 0.6, 0, 0], 3)
    assert float(eval_metrics.best_at_k(pool.scores_BN, 3)[0]) == pytest.approx(want, abs=1e-6)
    summary = eval_metrics.summarize_pool(pool, [1, 3, 6], key=jax.random.key(0))
    assert summary["pass@6"] == 1.0 and summary["valid_fraction"] == pytest.approx(0.5)
    assert {"best@1", "pass@3", "diversity", "pareto_fraction", "emax"} <= set(summary)


def test_plots_write_pngs(tmp_path):
    curves = {"grpo": ([1, 3, 10], [0.4, 0.45, 0.5]), "vpo": ([1, 3, 10], [0.35, 0.5, 0.6])}
    p1 = plots.plot_metric_vs_k(str(tmp_path / "a" / "best.png"), curves, metric="best@k")
    p2 = plots.plot_metrics_over_steps(str(tmp_path / "steps.png"), {
        "entropy": {"grpo": ([0, 1, 2], [1.0, 0.5, 0.2])},
        "diversity": {"grpo": ([0, 1, 2], [0.3, 0.2, 0.1]), "vpo": ([0, 1, 2], [0.3, 0.4, 0.5])}})
    for p in (p1, p2):
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="series 'x'"):
        plots.plot_metric_vs_k(str(tmp_path / "bad.png"), {"x": ([1, 2], [1.0])})



def test_thirteen_series_get_thirteen_distinct_styles():
    # a full comparison plots 13 policies; the ten-colour cycle alone would repeat three
    styles = [tuple(sorted(plots.series_style(i).items())) for i in range(13)]
    assert len(set(styles)) == 13
    assert plots.series_style(10)["color"] == plots.series_style(0)["color"]
    assert plots.series_style(10)["linestyle"] != plots.series_style(0)["linestyle"]

# -- sample_pool / evaluate_policy: a BoundTask and its records ----------------------------------

def _bound_bandit(host: bool = False):
    import dataclasses

    from vpo.tasks import make_task
    from vpo.tasks.bound import bind
    from vpo.tasks.words import task_word_tokenizer

    raw = make_task("bandit", max_answers=4)
    tok = task_word_tokenizer(raw)
    if host:  # the same task scored on the host only (as arithmetic or a user's reward)
        raw = dataclasses.replace(raw, symbols=None, arrays=None, symbol_reward=None)
    return bind(raw, tok)


def _scripted_sample(task, generations):
    """A stand-in for `vpo.rollout.slots.sample` that writes the given answer texts per
    generation."""
    from vpo.types import Rollout

    def fake(model, prompts_BP, mask_BP, key, cfg, *, stop_ids, pad_id):
        B, G, T = prompts_BP.shape[0], cfg.num_samples, cfg.max_new_tokens
        assert len(generations) == G and stop_ids == task.tokenizer.stop_ids
        assert pad_id == task.tokenizer.pad_id and mask_BP[:, -1].all()
        tokens = np.full((B, G, T), pad_id, np.int32)
        mask = np.zeros((B, G, T), bool)
        for g, answers in enumerate(generations):
            ids = task.answers_ids(answers)
            tokens[:, g, :len(ids)], mask[:, g, :len(ids)] = ids, True
        f = jnp.asarray(mask, jnp.float32)
        return Rollout(jnp.asarray(tokens), -f, -f, 0.5 * f, jnp.asarray(mask),
                       jnp.asarray(mask.sum(-1), jnp.int32), jnp.ones((B, G), bool))

    return fake


@pytest.mark.parametrize("host", [False, True])
def test_sample_pool_scores_generations_through_the_tokenizer(monkeypatch, host):
    """Two generations of two answers each, (A, B) and (C, C): 4 candidates per problem, the
    repeated C scored like any other answer (a single-answer policy's repeats across
    generations are too: no arm has its duplicates zeroed); in-graph and host scoring give the
    same pool."""
    from flax import nnx

    from vpo.config import model_preset
    from vpo.eval import policies as policy_eval
    from vpo.model.decoder import Decoder

    task = _bound_bandit(host)
    records = task.make_problems(0, 3)
    monkeypatch.setattr(policy_eval, "sample", _scripted_sample(task, [["A", "B"], ["C", "C"]]))
    model = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=64),
                    rngs=nnx.Rngs(0))
    pool, answers, amask, entropy = policy_eval.sample_pool(
        model, task, records, num_answers=2, budget=4, key=jax.random.key(0), chunk=2)
    np.testing.assert_allclose(pool.scores_BN, [[0.5, 0.5, 0.6, 0.6]] * 3, atol=1e-6)
    np.testing.assert_array_equal(pool.correct_BN, [[False, False, True, True]] * 3)
    np.testing.assert_array_equal(pool.valid_BN, [[True, True, True, True]] * 3)
    assert entropy == pytest.approx(0.5)
    if host:
        assert answers is None and amask is None
    else:
        arms = [task.task.symbols.index(a) for a in "ABC"]
        np.testing.assert_array_equal(np.asarray(answers)[:, :3, 0], [arms] * 3)
        assert int(eval_metrics.distinct_solutions(answers, amask, pool.valid_BN)[0]) == 3
    out, per = policy_eval.evaluate_policy_per_problem(
        model, task, records, num_answers=2, budget=4, ks=[1, 4], key=jax.random.key(0),
        per_problem=["pass@1", "best@4", "diversity"])
    assert out["best@4"] == pytest.approx(0.6) and out["best@1"] == pytest.approx(0.55)
    assert out["pass@4"] == 1.0 and out["pass@1"] == pytest.approx(0.5)
    assert out["valid_fraction"] == pytest.approx(1.0) and out["entropy"] == pytest.approx(0.5)
    assert ("distinct" in out) != host
    np.testing.assert_allclose(per["best_P"], [0.6] * 3, atol=1e-6)
    np.testing.assert_array_equal(per["solved_P"], [True] * 3)
    np.testing.assert_allclose(per["pass@1_P"], [0.5] * 3)  # 2 of the 4 candidates solve each
    np.testing.assert_allclose(per["best@4_P"], [0.6] * 3, atol=1e-6)
    assert per["diversity_P"].shape == (3,)
    assert np.mean(per["diversity_P"]) == pytest.approx(out["diversity"])
    with pytest.raises(ValueError, match="not computed per problem"):
        policy_eval.evaluate_policy_per_problem(
            model, task, records, num_answers=2, budget=4, ks=[1], key=jax.random.key(0),
            per_problem=["cover@2"])  # this task has no cover components


def test_evaluate_policy_samples_a_real_policy(tmp_path):
    from flax import nnx

    from vpo.config import ConfigError, model_preset
    from vpo.eval import policies as policy_eval
    from vpo.model.decoder import Decoder
    from vpo.tasks.bound import seq_len_for

    task = _bound_bandit()
    records = task.make_problems(0, 3)
    cfg = model_preset("tiny", vocab_size=task.tokenizer.size,
                       max_seq_len=seq_len_for(task, records, 2))
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    kw = dict(num_answers=2, budget=4, ks=[1, 2, 4])
    a = policy_eval.evaluate_policy(model, task, records, key=jax.random.key(1), **kw)
    b = policy_eval.evaluate_policy(model, task, records, key=jax.random.key(1), **kw)
    assert a == b  # same key, same metrics
    assert {"best@1", "pass@4", "diversity", "emax", "distinct", "entropy"} <= set(a)
    assert 0.0 <= a["valid_fraction"] <= 1.0 and a["entropy"] > 0
    table = policy_eval.write_eval_table(str(tmp_path), {"tiny": a}, [1, 2, 4], title="bandit")
    assert "| tiny |" in table and (tmp_path / "best_at_k.png").exists()
    with pytest.raises(ValueError, match="multiple of num_answers"):
        policy_eval.sample_pool(model, task, records, num_answers=3, budget=4,
                                key=jax.random.key(0))
    need = task.prompt_arrays(records, 2)[0].shape[1] + task.completion_len(2)
    short = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need - 1),
                    rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="model.max_seq_len"):
        policy_eval.sample_pool(short, task, records, num_answers=2, budget=4,
                                key=jax.random.key(0))


def test_pass_at_k_refuses_scores_and_a_missing_axis():
    """Float scores would be truncated to 0 (0.9 "not correct"): refused, as is a 1-D input."""
    with pytest.raises(TypeError, match="threshold scores first"):
        eval_metrics.pass_at_k(jnp.array([[0.5, 0.9]]), 1)
    with pytest.raises(ValueError, match=r"expected \[B problems, N candidates\]"):
        eval_metrics.pass_at_k(jnp.array([True, False]), 1)
    np.testing.assert_allclose(eval_metrics.pass_at_k(jnp.array([[1, 0]]), 1), [0.5])
