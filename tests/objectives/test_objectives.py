"""Tests for vpo.objectives: hand-computed values, the papers' unit checks, invariances,
exact micro-batch accumulation, jit == eager, and 8-device sharded == unsharded.

Shapes are fixed (B=4, G=4, M=3, R=2, T=8) so jit compiles are shared across tests.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vpo import objectives as obj

B, G, M, R, T = 4, 4, 3, 2, 8
AGGS = obj.AGG_MODES
SEEDS = st.integers(0, 2**31 - 1)
PROPS = settings(max_examples=25, deadline=None)


def midpoint_weights(K=1000):
    """w = (t, 1 - t) at the K midpoints of [0, 1]: exact quadrature of E_w[max] for d = 2 when
    every kink of max_j w.r_j sits on a cell boundary (true for all §8 checks with K = 1000)."""
    t = (np.arange(K) + 0.5) / K
    return jnp.asarray(np.stack([t, 1 - t], -1)[None], jnp.float32)  # 1KR


def as_set(points):
    r = jnp.asarray(points, jnp.float32)[None, None]  # 1 1 M R
    return r, jnp.ones(r.shape[:3], bool)


def random_rollouts(seed, b=B, g=G, m=M, r=R, p_valid=0.7):
    rng = np.random.default_rng(seed)
    rewards = jnp.asarray(rng.uniform(size=(b, g, m, r)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(b, g, m)) < p_valid)
    return rewards, mask


def random_tokens(seed, b=B, g=G, t=T):
    """Random logp / old logp / ref logp / entropy / mask with ragged lengths (>= 1 token each)."""
    rng = np.random.default_rng(seed)
    logp = rng.normal(-1.0, 0.5, (b, g, t))
    old = logp + rng.normal(0.0, 0.3, (b, g, t))
    ref = logp + rng.normal(0.0, 0.3, (b, g, t))
    ent = rng.gamma(1.0, 1.0, (b, g, t))
    lengths = rng.integers(1, t + 1, (b, g))
    mask = np.arange(t)[None, None, :] < lengths[..., None]
    adv = rng.normal(size=(b, g))
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return dict(
        logp=f(logp), old=f(old), ref=f(ref), ent=f(ent), mask=jnp.asarray(mask), adv=f(adv)
    )


def np_zscore(x, eps=1e-6, ddof=0):
    sd = x.std(ddof=ddof)
    return np.zeros_like(x) if sd < eps else (x - x.mean()) / (sd + eps)


# Jitted entry points shared by several tests (one compile each).
_vpo_jit = jax.jit(lambda r, m, k: obj.vpo_advantages(k, r, m, num_weights=64))
_vpo_w_jit = jax.jit(lambda r, m, w, mask: obj.vpo_advantages(r, m, weights_BKR=w, mask_BG=mask))
_vpo_k_jit = jax.jit(
    lambda r, m, k, K: obj.vpo_advantages(k, r, m, num_weights=K), static_argnums=3
)
_weights_jit = jax.jit(obj.dirichlet_weights, static_argnums=(1, 2, 3, 4, 5))


# ----------------------------------------------------------------------------- weights


@pytest.mark.parametrize("sampler", ["iid", "lattice"])
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_dirichlet_weights_on_simplex_with_dirichlet_moments(sampler, alpha):
    w = _weights_jit(jax.random.key(0), 4, 1024, 3, alpha, sampler)
    assert w.shape == (4, 1024, 3)
    assert bool(jnp.all(w >= 0))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    # Symmetric Dir(alpha) on R = 3: mean 1/3, var (1/3)(2/3)/(3 alpha + 1).
    np.testing.assert_allclose(w.mean((0, 1)), 1 / 3, atol=0.02)
    np.testing.assert_allclose(w.var((0, 1)), (2 / 9) / (3 * alpha + 1), rtol=0.1)


def test_weights_are_shared_within_a_group_but_differ_across_groups():
    w = obj.dirichlet_weights(jax.random.key(1), 2, 8, 2)
    assert not np.allclose(w[0], w[1])


def test_lattice_has_lower_variance_than_iid():
    pts, mask = as_set([[1, 0], [0, 1], [0.6, 0.6]])
    est = {}
    for sampler in ("iid", "lattice"):
        w = _weights_jit(jax.random.key(2), 200, 32, 2, 1.0, sampler)
        raw = jax.vmap(lambda w1: obj.expected_max(pts, mask, w1[None])[0, 0])(w)
        est[sampler] = np.asarray(raw)
    assert abs(est["lattice"].mean() - 0.76) < 0.005
    assert est["lattice"].std() < 0.5 * est["iid"].std()


@pytest.mark.parametrize("D", [1, 2, 3, 4, 5, 9])
def test_sorting_network_sorts(D):
    from vpo.objectives import vpo as _vpo

    u = np.random.default_rng(D).uniform(size=(3, D, 7)).astype(np.float32)
    u[0, :, 0] = u[0, 0, 0]  # ties
    got = np.stack(_vpo._sorted_rows(jnp.asarray(u)), axis=1)
    np.testing.assert_array_equal(got, np.sort(u, axis=1))


def test_bad_sampler_names_the_argument():
    with pytest.raises(ValueError, match="sampler"):
        obj.dirichlet_weights(jax.random.key(0), 1, 4, 2, sampler="sobol")


# ----------------------------------------------------------------------------- E_w[max] (§8)

UNIT_CHECKS = [
    ([[1, 0], [0, 1]], 0.75),
    ([[0.6, 0.6]], 0.60),
    ([[0.6, 0.6], [0.6, 0.6]], 0.60),
    ([[1, 0], [0, 1], [0.6, 0.6]], 0.76),
    ([[1, 0], [1, 0]], 0.50),
]


@pytest.mark.parametrize("points,value", UNIT_CHECKS)
def test_expected_max_unit_checks_exact_with_given_weights(points, value):
    r, m = as_set(points)
    np.testing.assert_allclose(obj.expected_max(r, m, midpoint_weights())[0, 0], value, atol=1e-5)


@pytest.mark.parametrize("points,value", UNIT_CHECKS)
def test_expected_max_unit_checks_monte_carlo(points, value):
    r, m = as_set(points)
    w = obj.dirichlet_weights(jax.random.key(3), 1, 20000, 2)
    np.testing.assert_allclose(obj.expected_max(r, m, w)[0, 0], value, atol=0.01)


def test_expected_max_hand_computed_and_masked():
    w = jnp.asarray([[[1, 0], [0, 1], [0.5, 0.5], [0.25, 0.75]]], jnp.float32)
    r = jnp.asarray([[[[1, 0], [0, 1], [9, 9]]]], jnp.float32)
    m = jnp.asarray([[[True, True, False]]])
    # max per weight: 1, 1, 0.5, 0.75 -> 0.8125; the (9, 9) answer is masked out.
    np.testing.assert_allclose(obj.expected_max(r, m, w)[0, 0], 0.8125, atol=1e-6)
    np.testing.assert_allclose(obj.expected_max(r, jnp.zeros_like(m), w)[0, 0], 0.0)


def test_expected_max_large_pool_matches_numpy():
    """M * R above the unroll limit takes the batched-dot path; weights with leading dim 1 are
    shared by all groups."""
    rng = np.random.default_rng(0)
    r = rng.uniform(size=(2, 1, 40, 3)).astype(np.float32)
    m = rng.uniform(size=(2, 1, 40)) < 0.5
    w = np.asarray(obj.dirichlet_weights(jax.random.key(0), 1, 16, 3))
    want = [(r[b, 0][m[b, 0]] @ w[0].T).max(0).mean() for b in range(2)]
    np.testing.assert_allclose(obj.expected_max(r, m, w)[:, 0], want, rtol=1e-5)


# ----------------------------------------------------------------------------- VPO advantages


def test_vpo_advantages_hand_computed():
    # rollouts: {corner, corner} 0.75, {compromise} 0.60, {corner, same corner} 0.50, {} 0.
    r = np.zeros((1, 4, 2, 2), np.float32)
    m = np.zeros((1, 4, 2), bool)
    r[0, 0] = [[1, 0], [0, 1]]
    r[0, 1, 0] = [0.6, 0.6]
    r[0, 2] = [[1, 0], [1, 0]]
    m[0, :3] = [[True, True], [True, False], [True, True]]
    adv, met = _vpo_w_jit(jnp.asarray(r), jnp.asarray(m), midpoint_weights(), None)
    raw = np.array([0.75, 0.6, 0.5, 0.0])
    np.testing.assert_allclose(adv[0], np_zscore(raw), atol=1e-4)
    np.testing.assert_allclose(met["vpo/own_pool_expected_max"], raw.mean(), atol=1e-5)
    np.testing.assert_allclose(met["vpo/pool_expected_best"], 0.76, atol=1e-5)
    np.testing.assert_allclose(met["vpo/group_std_mean"], raw.std(), atol=1e-5)
    np.testing.assert_allclose(met["vpo/pool_size_mean"], 5 / 4)


def test_vpo_constant_and_empty_groups_get_zero_advantage():
    r, m = random_rollouts(0)
    r = r.at[1].set(jnp.broadcast_to(r[1, :1], r[1].shape))  # every rollout the same set
    m = m.at[1].set(jnp.broadcast_to(m[1, :1], m[1].shape))
    m = m.at[2].set(False)  # every rollout unparseable
    adv, met = _vpo_jit(r, m, jax.random.key(0))
    np.testing.assert_array_equal(adv[1:3], 0.0)
    assert float(met["vpo/zero_std_frac"]) >= 0.5


def test_vpo_m1_approaches_grpo_on_component_mean():
    r, _ = random_rollouts(0)
    m = jnp.zeros((B, G, M), bool).at[..., 0].set(True)  # one answer per rollout
    target = obj.grpo_advantages(r[:, :, 0].mean(-1), std="population")[0]
    err = {}
    for K in (8, 4096):
        adv, _ = _vpo_k_jit(r, m, jax.random.key(1), K)
        err[K] = float(jnp.mean(jnp.abs(adv - target)))
    assert err[4096] < 0.05 and err[4096] < 0.5 * err[8]


def test_vpo_rollout_mask_drops_padding_from_group_stats():
    r, m = random_rollouts(1)
    w = obj.dirichlet_weights(jax.random.key(0), B, 64, R)
    rollout_mask = jnp.arange(G)[None, :] < 3
    r_pad = r.at[:, 3].set(5.0)  # padding content must not matter
    adv, _ = _vpo_w_jit(r_pad, m, w, jnp.broadcast_to(rollout_mask, (B, G)))
    ref, _ = _vpo_w_jit(r[:, :3], m[:, :3], w, None)
    np.testing.assert_allclose(adv[:, :3], ref, atol=1e-5)
    np.testing.assert_array_equal(adv[:, 3], 0.0)


def test_vpo_needs_exactly_one_weight_source():
    r, m = random_rollouts(0)
    with pytest.raises(ValueError, match="key"):
        obj.vpo_advantages(None, r, m)
    with pytest.raises(ValueError, match="solution_mask_BGM"):
        obj.expected_max(r, m[..., :1], obj.dirichlet_weights(jax.random.key(0), B, 4, R))


@PROPS
@given(SEEDS, st.permutations(range(G)))
def test_vpo_permuting_rollouts_permutes_advantages(seed, perm):
    r, m = random_rollouts(seed)
    perm = np.asarray(perm)
    key = jax.random.key(seed % 1000)
    adv, met = _vpo_jit(r, m, key)
    adv_p, met_p = _vpo_jit(r[:, perm], m[:, perm], key)
    np.testing.assert_allclose(adv_p, adv[:, perm], atol=1e-4)  # float32 summation order
    np.testing.assert_allclose(
        met_p["vpo/pool_expected_best"], met["vpo/pool_expected_best"], atol=1e-6
    )


@PROPS
@given(SEEDS, st.floats(-0.5, 0.5), st.floats(0.25, 4.0))
def test_vpo_shapes_finiteness_and_affine_invariance(seed, shift, scale):
    r, m = random_rollouts(seed)
    m = m.at[..., 0].set(True)  # non-empty sets: E_w[max] shifts by c and scales with s exactly
    key = jax.random.key(seed % 1000)
    adv, met = _vpo_jit(r, m, key)
    assert adv.shape == (B, G) and bool(jnp.all(jnp.isfinite(adv)))
    assert all(v.shape == () and bool(jnp.isfinite(v)) for v in met.values())
    assert float(met["vpo/pool_expected_best"]) >= float(met["vpo/own_pool_expected_max"]) - 1e-6
    np.testing.assert_allclose(jnp.mean(adv, -1), 0.0, atol=1e-4)
    adv2, _ = _vpo_jit(scale * r + shift, m, key)
    np.testing.assert_allclose(adv2, adv, atol=2e-3)


# ----------------------------------------------------------------------------- scalar baselines


def test_grpo_hand_computed():
    r = jnp.asarray([[1, 2, 3, 4], [5, 5, 5, 5]])
    c = np.array([-1.5, -0.5, 0.5, 1.5])
    pop, unb = np.sqrt(1.25), np.sqrt(5 / 3)
    np.testing.assert_allclose(
        obj.grpo_advantages(r, std="population")[0][0], c / (pop + 1e-6), rtol=1e-5
    )
    np.testing.assert_allclose(obj.grpo_advantages(r)[0][0], c / (unb + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(obj.grpo_advantages(r, scale="none")[0][0], c)
    np.testing.assert_array_equal(obj.grpo_advantages(r)[0][1], 0.0)
    batch_sd = np.std([1, 2, 3, 4, 5, 5, 5, 5], ddof=1)
    np.testing.assert_allclose(
        obj.grpo_advantages(r, scale="batch")[0][0], c / (batch_sd + 1e-6), rtol=1e-5
    )


def test_grpo_mask_and_lone_rollouts():
    r = jnp.asarray([[1.0, 3.0, 100.0, -7.0], [2.0, 9.0, 9.0, 9.0]])
    mask = jnp.asarray([[True, True, False, False], [True, False, False, False]])
    adv = obj.grpo_advantages(r, mask, scale="none")[0]
    np.testing.assert_allclose(adv, [[-1, 1, 0, 0], [0, 0, 0, 0]])


def test_bad_mode_strings_name_the_argument():
    with pytest.raises(ValueError, match="scale"):
        obj.grpo_advantages(jnp.ones((2, 2)), scale="global")[0]
    with pytest.raises(ValueError, match="std"):
        obj.grpo_advantages(jnp.ones((2, 2)), std="sample")[0]
    with pytest.raises(ValueError, match="rewards_BG"):
        obj.grpo_advantages(jnp.ones((2, 2, 2)))[0]


def test_clip_ranges_outside_the_ratio_bounds_are_refused():
    z = jnp.zeros((1, 2, 3))
    args = (z, z, jnp.zeros((1, 2)), jnp.ones((1, 2, 3), bool))
    for bad in (dict(clip_eps_low=1.5), dict(clip_eps_low=-0.1), dict(clip_eps_high=-0.2)):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}=.* must be in"):
            obj.policy_loss(*args, **bad)
    obj.policy_loss(*args, clip_eps_low=1.0, clip_eps_high=1e9)  # no clipping: allowed


def test_rloo_and_maxrl_hand_computed():
    r = jnp.asarray([[1, 2, 3, 4], [0, 1, 1, 2]])
    np.testing.assert_allclose(
        obj.rloo_advantages(r)[0][0], [1 - 3, 2 - 8 / 3, 3 - 7 / 3, 4 - 2], rtol=1e-5
    )
    np.testing.assert_allclose(obj.maxrl_advantages(r)[0][1], [-1, 0, 0, 1], rtol=1e-5)
    np.testing.assert_array_equal(obj.maxrl_advantages(jnp.zeros((1, 4)))[0], 0.0)


def brute_max_at_k(r, k):
    n = len(r)
    credit = np.zeros(n)
    for subset in itertools.combinations(range(n), k):
        best = max(r[i] for i in subset)
        for i in subset:
            credit[i] += best
    credit /= math.comb(n, k)
    return credit - credit.mean()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_max_at_k_equals_brute_force_enumeration(k):
    rng = np.random.default_rng(k)
    r = rng.integers(0, 4, (B, G)).astype(np.float32)  # ties included
    adv = obj.max_at_k_advantages(jnp.asarray(r), k, std_normalize=False)[0]
    for b in range(B):
        np.testing.assert_allclose(adv[b], brute_max_at_k(r[b], k), atol=1e-5)
    mask = np.array([True, False, True, True])  # padding is excluded: n = 3
    adv_m = obj.max_at_k_advantages(jnp.asarray(r), k, jnp.asarray(np.broadcast_to(mask, (B, G))),
                                    std_normalize=False)[0]
    for b in range(B):
        np.testing.assert_allclose(adv_m[b, mask], brute_max_at_k(r[b, mask], k), atol=1e-5)
        assert adv_m[b, 1] == 0


@jax.jit
def _max_at_2_normalised(r):
    return {std: obj.max_at_k_advantages(r, 2, std_normalize=True, std=std)[0]
            for std in ("unbiased", "population")}


def test_max_at_k_std_normalised_as_verl():
    """verl's max_at_k: credits minus the group mean, over the unbiased std (torch.std) + 1e-6."""
    rng = np.random.default_rng(11)
    r = rng.uniform(size=(B, G)).astype(np.float32)
    r[-1] = 0.3137  # a constant group: exactly 0 (rounding is never divided by a ~0 std)
    out = _max_at_2_normalised(jnp.asarray(r))
    for std, ddof in (("unbiased", 1), ("population", 0)):
        for b in range(B - 1):
            c = brute_max_at_k(r[b], 2)  # already centred
            np.testing.assert_allclose(out[std][b], c / (c.std(ddof=ddof) + 1e-6), rtol=1e-5,
                                       atol=1e-6)
        np.testing.assert_array_equal(out[std][-1], 0.0)


def brute_pass_at_k(correct, k, eps=1e-6):
    """Every k-subset scores pass@k (1 if it holds a correct rollout); z-score over all subsets
    (population std); a rollout's advantage is the mean z of the subsets that contain it."""
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    score = np.array([float(any(correct[i] for i in s)) for s in subsets])
    z = (score - score.mean()) / (score.std() + eps)
    total, count = np.zeros(n), np.zeros(n)
    for s, zs in zip(subsets, z, strict=True):
        total[list(s)] += zs
        count[list(s)] += 1
    return total / count


PASSK_N = 6
PASSK_MASK = np.array([True, False, True, True, False, True])


@jax.jit
def _pass_at_k_all(correct):
    """For k = 1..5 (static): advantages on the full groups and on 4 of the 6 rollouts."""
    mask = jnp.broadcast_to(jnp.asarray(PASSK_MASK), correct.shape)
    return {k: (obj.pass_at_k_advantages(correct, k)[0],
                 obj.pass_at_k_advantages(correct, k, mask)[0])
            for k in range(1, PASSK_N)}


def test_pass_at_k_equals_brute_force_enumeration():
    """Chen et al. 2025 (arXiv 2508.10751): the analytic advantages equal the enumeration over
    all k-subsets, for every k < n and every count of correct rollouts (0, all, too few wrong);
    a masked group equals the enumeration over its valid rollouts."""
    correct = np.array([[i < c for i in range(PASSK_N)] for c in range(PASSK_N + 1)])
    correct = np.concatenate([correct, correct[:, ::-1]])  # positions do not matter
    out = _pass_at_k_all(jnp.asarray(correct))
    for k, (adv, adv_m) in out.items():
        for row, a, a_m in zip(correct, np.asarray(adv), np.asarray(adv_m), strict=True):
            np.testing.assert_allclose(a, brute_pass_at_k(row, k), rtol=2e-5, atol=2e-5)
            if k <= PASSK_MASK.sum():
                np.testing.assert_allclose(a_m[PASSK_MASK], brute_pass_at_k(row[PASSK_MASK], k),
                                           rtol=2e-5, atol=2e-5)
            assert np.all(a_m[~PASSK_MASK] == 0)
    # hand-computed, n = 6, c = 1, k = 2: rho = 1 - C(5,2)/C(6,2) = 1/3, sigma = sqrt(2)/3;
    # A_pos = (2/3)/sigma, A_neg = (2/3 - C(4,1)/C(5,1))/sigma
    sigma = math.sqrt(2) / 3
    np.testing.assert_allclose(out[2][0][1], [(2 / 3) / sigma] + [(2 / 3 - 4 / 5) / sigma] * 5,
                               rtol=1e-5)
    # k = 1 is GRPO with the population std
    r = jnp.asarray(correct, jnp.float32)
    np.testing.assert_allclose(out[1][0], obj.grpo_advantages(r, std="population")[0], rtol=1e-5,
                               atol=1e-6)


def test_random_weight_grpo_is_grpo_on_a_group_shared_dirichlet_scalarisation():
    rng = np.random.default_rng(12)
    r = jnp.asarray(rng.uniform(size=(B, G, R)), jnp.float32)
    w = jnp.asarray(rng.dirichlet(np.ones(R), size=B), jnp.float32)
    adv, met = obj.random_weight_grpo_advantages(None, r, weights_BR=w, std="population")
    np.testing.assert_array_equal(met["rw_grpo/weights_BR"], w)
    np.testing.assert_allclose(
        adv, obj.grpo_advantages(jnp.einsum("bgr,br->bg", r, w), std="population")[0], rtol=1e-5)
    w1 = obj.random_weight_grpo_advantages(jax.random.key(0), r)[1]["rw_grpo/weights_BR"]
    w2 = obj.random_weight_grpo_advantages(jax.random.key(1), r)[1]["rw_grpo/weights_BR"]
    assert w1.shape == (B, R) and np.allclose(w1.sum(-1), 1.0) and bool(jnp.all(w1 >= 0))
    assert len({tuple(np.round(x, 6)) for x in np.asarray(w1)}) == B  # one per group
    assert not np.allclose(w1, w2)  # fresh per call (the step's key)
    with pytest.raises(ValueError, match="exactly one"):
        obj.random_weight_grpo_advantages(None, r)


def test_best_of_group_hand_computed():
    r = jnp.asarray([[1.0, 3.0, 2.0, 0.0], [2.0, 2.0, 1.0, 0.0]])
    adv = obj.best_of_group_advantages(r, std_normalize=False)[0]
    np.testing.assert_allclose(adv, [[0, 1, 0, 0], [0, 0, 0, 0]])
    adv_s = obj.best_of_group_advantages(r)[0]
    np.testing.assert_allclose(adv_s[0, 1], 1 / (np.std([1, 3, 2, 0], ddof=1) + 1e-6), rtol=1e-5)


def test_gdpo_matches_numpy_reference():
    rng = np.random.default_rng(0)
    r = rng.integers(0, 3, (B, G, R)).astype(np.float32)
    w = np.array([0.3, 0.7], np.float32)
    z = np.stack([[np_zscore(r[b, :, c], ddof=1) for c in range(R)] for b in range(B)])  # B R G
    s = np.einsum("brg,r->bg", z, w)
    ref = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(obj.gdpo_advantages(jnp.asarray(r), weights_R=w)[0], ref, atol=1e-4)


_SCALAR_FNS = {
    "grpo": obj.grpo_advantages,
    "rloo": obj.rloo_advantages,
    "maxrl": obj.maxrl_advantages,
    "max_at_k": obj.max_at_k_advantages,
    "pass_at_k": lambda r, mask_BG: obj.pass_at_k_advantages(r > 1, mask_BG=mask_BG),
    "best_of_group": obj.best_of_group_advantages,
}
_scalar_jit = {n: jax.jit(lambda *a, f=f, **k: f(*a, **k)[0])
               for n, f in _SCALAR_FNS.items()}


@PROPS
@given(SEEDS, st.permutations(range(G)))
def test_scalar_advantages_shapes_finiteness_permutation(seed, perm):
    rng = np.random.default_rng(seed)
    r = jnp.asarray(rng.integers(0, 3, (B, G)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(B, G)) < 0.8)
    perm = np.asarray(perm)
    for name, f in _scalar_jit.items():
        adv = f(r, mask_BG=mask)
        assert adv.shape == (B, G) and bool(jnp.all(jnp.isfinite(adv))), name
        assert bool(jnp.all(jnp.where(mask, True, adv == 0))), name
        adv_p = f(r[:, perm], mask_BG=mask[:, perm])
        if name != "best_of_group":  # ties broken by position
            np.testing.assert_allclose(adv_p, adv[:, perm], atol=1e-5, err_msg=name)
    adv = _scalar_jit["grpo"](r, mask_BG=mask)
    np.testing.assert_allclose(_scalar_jit["grpo"](3.0 * r + 1.0, mask_BG=mask), adv, atol=1e-4)


# ----------------------------------------------------------------------------- policy loss


def pad(x, fill=0.0):
    """A small hand-written [b, g(, t)] array in the corner of the fixed (B, G(, T)) shape, so all
    policy-loss tests share one shape (and one set of compiles); the rest is masked padding."""
    x = np.asarray(x)
    out = np.full((B, G, T)[: x.ndim], fill, x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return jnp.asarray(out)


def test_policy_loss_hand_computed_ppo_clip():
    # One sequence, 4 tokens, A = +1 on the first two and -1 on the last two.
    logp = pad(np.log([[[1.5, 1.1, 0.5, 4.0]]]))
    old = pad(np.zeros((1, 1, 4)))
    adv = pad([[[1.0, 1.0, -1.0, -1.0]]])
    mask = pad(np.ones((1, 1, 4), bool), False)
    # ratios 1.5, 1.1, 0.5, 4.0 ; eps 0.2 -> per-token -A*clip: -1.2, -1.1, 0.8, 4.0 (no dual clip)
    loss, met = obj.policy_loss(logp, old, adv, mask)
    np.testing.assert_allclose(loss, (-1.2 - 1.1 + 0.8 + 4.0) / 4, rtol=1e-5)
    np.testing.assert_allclose([met["clip_frac_high"], met["clip_frac_low"]], [0.25, 0.25])
    loss_d, met_d = obj.policy_loss(logp, old, adv, mask, dual_clip=3.0, clip_eps_high=0.28)
    np.testing.assert_allclose(loss_d, (-1.28 - 1.1 + 0.8 + 3.0) / 4, rtol=1e-5)
    np.testing.assert_allclose(met_d["clip_frac_dual"], 0.25)
    np.testing.assert_allclose([met["ratio_min"], met["ratio_max"]], [0.5, 4.0], rtol=1e-5)


def test_gppo_keeps_ppo_values_and_bounds_clipped_gradients():
    # Ratios 1.5 (A = +1, clipped high), 1.1 (A = +1, inside), 0.5 (A = -1, clipped low), 0.9
    # (A = -1, inside); eps 0.2, token-mean over 4 tokens. PPO: a clipped token has no gradient.
    # GPPO (arXiv 2508.07629): the same loss, and d loss / d logp_t = -(1 ± eps) A_t / 4 there.
    logp = pad(np.log([[[1.5, 1.1, 0.5, 0.9]]]))
    old = pad(np.zeros((1, 1, 4)))
    adv = pad([[[1.0, 1.0, -1.0, -1.0]]])
    mask = pad(np.ones((1, 1, 4), bool), False)

    def loss(lp, gppo):
        return obj.policy_loss(lp, old, adv, mask, gppo=gppo)[0]

    ppo, gppo = loss(logp, False), loss(logp, True)
    np.testing.assert_allclose(gppo, ppo, rtol=1e-6)
    np.testing.assert_allclose(ppo, (-1.2 - 1.1 + 0.8 + 0.9) / 4, rtol=1e-5)
    g_ppo = np.asarray(jax.grad(loss)(logp, False))[0, 0, :4]
    g_gppo = np.asarray(jax.grad(loss)(logp, True))[0, 0, :4]
    # inside the clip range d(-A rho)/d logp = -A rho
    np.testing.assert_allclose(g_ppo, [0.0, -1.1 / 4, 0.0, 0.9 / 4], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_gppo, [-1.2 / 4, -1.1 / 4, 0.8 / 4, 0.9 / 4], rtol=1e-5)
    with pytest.raises(ValueError, match="kl_cov"):
        obj.policy_loss(logp, old, adv, mask, gppo=True, cov_control="kl_cov")


def test_policy_loss_aggregation_modes_hand_computed():
    # At ratio 1 the per-token loss is -A. Sequence 0: 2 tokens, A=1; sequence 1: 4 tokens, A=2;
    # every other sequence is padding.
    mask = pad(np.asarray([[[1, 1, 0, 0], [1, 1, 1, 1]]], bool), False)
    adv = pad([[1.0, 2.0]], 5.0)
    logp = jnp.zeros((B, G, T))
    want = {
        "token-mean": -(2 * 1 + 4 * 2) / 6,
        "seq-mean-token-mean": -(1 + 2) / 2,
        "seq-mean-token-sum": -(2 + 8) / 2,
        "seq-mean-token-sum-norm": -(2 + 8) / (2 * T),  # horizon defaults to T
    }
    for agg, value in want.items():
        loss, met = obj.policy_loss(logp, logp, adv, mask, agg=agg)
        np.testing.assert_allclose(loss, value, rtol=1e-6, err_msg=agg)
        ratio = met["loss_numerator"] / met["loss_denominator"]
        np.testing.assert_allclose(ratio, value, rtol=1e-6)
    loss, _ = obj.policy_loss(logp, logp, adv, mask, agg="seq-mean-token-sum-norm", horizon=10)
    np.testing.assert_allclose(loss, -10 / 20, rtol=1e-6)


def test_kl_estimators_and_entropy_bonus_hand_computed():
    logp = jnp.full((B, G, T), -1.0)
    ref = pad(np.full((1, 1, 2), -1.5), 7.0)  # delta = -0.5 on the two valid tokens
    mask = pad(np.ones((1, 1, 2), bool), False)
    zero = jnp.zeros((B, G))
    d = -0.5
    for est, value in {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(d) - 1 - d}.items():
        loss, met = obj.policy_loss(
            logp, logp, zero, mask, ref_logp_BGT=ref, kl_coef=0.1, kl_estimator=est
        )
        np.testing.assert_allclose(met["kl"], value, rtol=1e-5)
        np.testing.assert_allclose(loss, 0.1 * value, rtol=1e-5)
    ent = pad([[[0.5, 1.5]]], 9.0)
    loss, met = obj.policy_loss(logp, logp, zero, mask, entropy_BGT=ent, entropy_coef=0.01)
    np.testing.assert_allclose([loss, met["entropy"]], [-0.01, 1.0], rtol=1e-5)
    with pytest.raises(ValueError, match="ref_logp_BGT"):
        obj.policy_loss(logp, logp, zero, mask, kl_coef=0.1)


def test_gspo_sequence_ratio_hand_computed():
    logp = pad([[[0.2, -0.1, 0.5]]])  # log ratios vs old = 0; token 3 is padding
    mask = pad([[[True, True, False]]], False)

    def loss(lp):
        return obj.policy_loss(lp, jnp.zeros_like(lp), pad([[1.0]]), mask, ratio_level="sequence")

    (value, met), grad = jax.value_and_grad(loss, has_aux=True)(logp)
    s = math.exp(0.05)  # exp(mean log ratio over the 2 valid tokens), inside the clip range
    np.testing.assert_allclose([value, met["ratio_mean"]], [-s, s], rtol=1e-5)
    np.testing.assert_allclose(grad, pad([[[-s / 2, -s / 2]]]), rtol=1e-5)  # GSPO-token gradient


def _loss_fn(agg, ratio_level="token", **kw):
    def f(logp, d, denominator=None):
        return obj.policy_loss(
            logp,
            d["old"],
            d["adv"],
            d["mask"],
            ref_logp_BGT=d["ref"],
            entropy_BGT=d["ent"],
            agg=agg,
            ratio_level=ratio_level,
            loss_denominator=denominator,
            kl_coef=0.05,
            entropy_coef=0.01,
            dual_clip=3.0,
            clip_eps_high=0.28,
            **kw,
        )[0]

    return f


@functools.partial(jax.jit, static_argnames="ratio_level")
def _accumulation(d, ratio_level):
    """For every agg mode: full-batch (loss, grad), and the sums over 2 and 4 micro-batches (split
    along B, each normalised by the full batch's `loss_denominator`). One compile per ratio level;
    the micro-batches run under vmap."""
    out = {}
    for agg in AGGS:
        f = jax.value_and_grad(_loss_fn(agg, ratio_level))
        den = obj.loss_denominator(d["mask"], agg)
        out[agg, 1] = f(d["logp"], d)
        for n in (2, 4):
            parts = jax.tree.map(lambda x, n=n: x.reshape((n, B // n) + x.shape[1:]), d)
            values, grads = jax.vmap(lambda p, f=f, den=den: f(p["logp"], p, den))(parts)
            out[agg, n] = (values.sum(), grads.reshape((B,) + grads.shape[2:]))
    return out


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_microbatch_accumulation_equals_one_big_batch(ratio_level):
    out = _accumulation(random_tokens(0), ratio_level)
    for agg in AGGS:
        full, g_full = out[agg, 1]
        for n in (2, 4):
            total, grads = out[agg, n]
            np.testing.assert_allclose(total, full, rtol=1e-5, atol=1e-6, err_msg=agg)
            np.testing.assert_allclose(grads, g_full, rtol=1e-5, atol=1e-7, err_msg=agg)


def test_zero_advantage_gives_zero_policy_gradient():
    d = random_tokens(1)
    adv = obj.grpo_advantages(jnp.full((B, G), 0.7))[0]  # constant groups
    np.testing.assert_array_equal(adv, 0.0)
    for agg in AGGS:

        def loss(lp, agg=agg):
            return obj.policy_loss(lp, d["old"], adv, d["mask"], agg=agg, dual_clip=3.0)[0]

        np.testing.assert_array_equal(jax.grad(loss)(d["logp"]), 0.0)


@jax.jit
def _clean_and_junk(d, junk, key):
    """(value, grad) on clean inputs and on inputs with nan/inf padding, for every agg mode, each
    paired with a token-selecting control (one compile)."""
    controls = (
        dict(cov_control="clip_cov", key=key, clip_cov_ratio=0.2, clip_cov_lb=-1.0),
        dict(cov_control="kl_cov", kl_cov_ratio=0.1),
        dict(entropy_top_frac=0.3),
        dict(cov_control="clip_cov", key=key, clip_cov_ratio=0.2, entropy_top_frac=0.5),
    )
    out = []
    for agg, kw in zip(AGGS, controls, strict=True):
        f = jax.value_and_grad(_loss_fn(agg, **kw))
        out.append((f(d["logp"], d), f(junk["logp"], junk)))
    return out


def test_padding_is_excluded_everywhere():
    d = random_tokens(2)
    pad = ~d["mask"]
    junk = {k: jnp.where(pad, jnp.nan, d[k]) for k in ("logp", "old", "ref", "ent")}
    junk["adv"] = jnp.where(pad, jnp.inf, jnp.broadcast_to(d["adv"][..., None], pad.shape))
    junk["mask"] = d["mask"]
    d = dict(d, adv=jnp.broadcast_to(d["adv"][..., None], pad.shape))  # same pytree structure
    for (clean_v, clean_g), (junk_v, junk_g) in _clean_and_junk(d, junk, jax.random.key(0)):
        np.testing.assert_allclose(junk_v, clean_v, rtol=1e-6)
        np.testing.assert_allclose(junk_g, clean_g, rtol=1e-6, atol=1e-8)
        assert bool(jnp.all(jnp.where(pad, junk_g == 0, True)))


def token_cov(d):
    """cov_t = (A_t - mean A)(logp_t - mean logp) over valid tokens; -inf on padding (§2.3)."""
    mask = np.asarray(d["mask"])
    adv = np.broadcast_to(np.asarray(d["adv"])[..., None], mask.shape)
    logp = np.asarray(d["logp"])
    cov = (adv - adv[mask].mean()) * (logp - logp[mask].mean())
    return np.where(mask, cov, -np.inf), adv


def test_clip_cov_selects_documented_count_at_random():
    d = random_tokens(3)
    n_valid = int(d["mask"].sum())
    loss = functools.partial(obj.policy_loss, d["logp"], d["old"], d["adv"], d["mask"])
    no_ppo_clip = dict(cov_control="clip_cov", clip_eps_low=1.0, clip_eps_high=1e9)
    everything = dict(no_ppo_clip, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    for ratio in (0.1, 0.25, 1e-4):
        _, met = loss(key=jax.random.key(0), clip_cov_ratio=ratio, **everything)
        assert round(float(met["clip_cov_frac"]) * n_valid) == max(int(ratio * n_valid), 1)
    picks = [loss(key=jax.random.key(s), clip_cov_ratio=0.1, **everything)[0] for s in range(2)]
    assert float(picks[0]) != float(picks[1])  # different keys, different tokens
    # Fewer candidates (lb < cov < ub) than max(floor(ratio N), 1): all of them, no more.
    cov, _ = token_cov(d)
    lb = float(np.sort(cov[np.isfinite(cov)])[-4])  # strictly above: the top 3 tokens
    _, met = loss(
        key=jax.random.key(0), clip_cov_ratio=0.5, clip_cov_lb=lb, clip_cov_ub=1e9, **no_ppo_clip
    )
    np.testing.assert_allclose(float(met["clip_cov_frac"]) * n_valid, 3, atol=1e-3)
    with pytest.raises(ValueError, match="key"):
        loss(cov_control="clip_cov")


def test_kl_cov_penalises_exactly_the_top_covariance_tokens():
    d = random_tokens(4)
    mask = np.asarray(d["mask"])
    n_valid = int(mask.sum())
    ratio = 0.1
    n = max(int(ratio * n_valid), 1)
    cov, adv = token_cov(d)
    top = (np.argsort(-cov, axis=None)[:n, None] == np.arange(cov.size)).any(0).reshape(cov.shape)
    log_ratio = np.asarray(d["logp"] - d["old"])
    per_token = -adv * np.exp(log_ratio) + 2.0 * np.abs(log_ratio) * top  # no ratio clipping
    want = per_token[mask].sum() / n_valid
    loss, met = obj.policy_loss(
        d["logp"],
        d["old"],
        d["adv"],
        d["mask"],
        cov_control="kl_cov",
        kl_cov_ratio=ratio,
        kl_cov_coef=2.0,
    )
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(float(met["kl_cov_frac"]) * n_valid, n, atol=1e-3)


def test_kl_cov_with_zero_advantage_on_policy_gives_zero_gradient():
    """On-policy every log-ratio is exactly 0; with A = 0 all tokens tie on cov and KL-Cov still
    selects some: the |log ratio| penalty must not push them (torch: d|x|/dx = 0 at 0)."""
    d = random_tokens(8)

    @jax.jit
    def grads(logp, mask):
        def loss(lp, agg):
            return obj.policy_loss(lp, lp, jnp.zeros((B, G)), mask, agg=agg, cov_control="kl_cov",
                                   kl_cov_ratio=0.5, kl_cov_coef=3.0)

        return {agg: jax.grad(loss, has_aux=True)(logp, agg) for agg in AGGS}

    for grad, met in grads(d["logp"], d["mask"]).values():
        assert float(met["kl_cov_frac"]) > 0.4  # the penalty is applied on half the tokens
        np.testing.assert_array_equal(grad, 0.0)


def test_kl_cov_penalty_gradient_follows_the_torch_sign_convention():
    """d/dlogp of kl_cov_coef |logp - old| on a selected token is kl_cov_coef * sign(log ratio)
    (0 where the ratio is exactly 1), plus the policy-gradient term -A exp(log ratio)."""
    d = random_tokens(9)
    mask = np.asarray(d["mask"])
    # a third of the tokens exactly on-policy, the rest off by +-0.1
    offset = np.random.default_rng(9).choice([-0.1, 0.0, 0.1], size=mask.shape)
    old = d["logp"] - jnp.asarray(offset, jnp.float32)
    coef, n_valid = 2.0, mask.sum()

    @jax.jit
    @jax.grad
    def grad_fn(lp):
        return obj.policy_loss(lp, old, d["adv"], d["mask"], cov_control="kl_cov",
                               kl_cov_ratio=1.0, kl_cov_coef=coef)[0]  # every token selected

    grad = np.asarray(grad_fn(d["logp"]))
    log_ratio = np.asarray(d["logp"] - old)
    adv = np.broadcast_to(np.asarray(d["adv"])[..., None], mask.shape)
    want = np.where(mask, -adv * np.exp(log_ratio) + coef * np.sign(log_ratio), 0.0) / n_valid
    assert (np.asarray(log_ratio)[mask] == 0).sum() > 10
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_cov_logp_adv_metric_is_the_token_covariance():
    d = random_tokens(10)
    _, met = obj.policy_loss(d["logp"], d["old"], d["adv"], d["mask"])
    cov, _ = token_cov(d)
    np.testing.assert_allclose(met["cov_logp_adv"], cov[np.asarray(d["mask"])].mean(), rtol=1e-5)


def test_cov_min_tokens_floors_the_selection():
    d = random_tokens(11)
    n_valid = int(d["mask"].sum())

    @jax.jit
    def selected(logp, old, adv, mask):
        return {n: obj.policy_loss(logp, old, adv, mask, cov_control="kl_cov", kl_cov_ratio=1e-3,
                                   cov_min_tokens=n)[1]["kl_cov_frac"] for n in (1, 10, 10_000)}

    for min_tokens, frac in selected(d["logp"], d["old"], d["adv"], d["mask"]).items():
        np.testing.assert_allclose(float(frac) * n_valid, min(min_tokens, n_valid), atol=1e-3)


def test_high_entropy_minority_mask():
    d = random_tokens(5)
    mask = d["mask"]
    for rho in (0.2, 0.5):
        loss, met = obj.policy_loss(
            d["logp"], d["logp"], d["adv"], mask, entropy_BGT=d["ent"], entropy_top_frac=rho
        )
        h = np.asarray(d["ent"])[np.asarray(mask)]
        keep = np.asarray(d["ent"]) >= np.quantile(h, 1 - rho)
        adv = np.broadcast_to(np.asarray(d["adv"])[..., None], mask.shape)
        want = -(adv * keep * np.asarray(mask)).sum() / mask.sum()  # denominator counts all tokens
        np.testing.assert_allclose(loss, want, rtol=1e-5)
        assert abs(float(met["high_entropy_frac"]) - rho) < 0.05


def test_policy_loss_validates_modes_and_shapes():
    d = random_tokens(0)
    args = (d["logp"], d["old"], d["adv"], d["mask"])
    for kw, name in (
        (dict(agg="token-sum"), "agg"),
        (dict(ratio_level="seq"), "ratio_level"),
        (dict(cov_control="cov"), "cov_control"),
        (dict(kl_estimator="k4"), "kl_estimator"),
        (dict(clip_cov_ratio=20.0), "clip_cov_ratio"),
        (dict(cov_min_tokens=0), "cov_min_tokens"),
    ):
        with pytest.raises(ValueError, match=name):
            obj.policy_loss(*args, **kw)
    with pytest.raises(ValueError, match="old_logp_BGT"):
        obj.policy_loss(d["logp"], d["old"][..., :3], d["adv"], d["mask"])


_ALL_CONTROLS = dict(
    cov_control="clip_cov",
    clip_cov_ratio=0.1,
    clip_cov_lb=-1.0,
    entropy_top_frac=0.3,
    kl_coef=0.05,
    entropy_coef=0.01,
    dual_clip=3.0,
    clip_eps_high=0.28,
)


def _full_loss(logp, old, adv, mask, ref, ent, key, cov_control="clip_cov"):
    kw = dict(_ALL_CONTROLS, cov_control=cov_control)
    return obj.policy_loss(logp, old, adv, mask, ref_logp_BGT=ref, entropy_BGT=ent, key=key, **kw)


@PROPS
@given(SEEDS)
def test_policy_loss_finite_and_ratio_one_gradient(seed):
    d = random_tokens(seed)
    loss, met = _full_loss_jit(
        d["logp"], d["old"], d["adv"], d["mask"], d["ref"], d["ent"], jax.random.key(0)
    )
    assert loss.shape == () and bool(jnp.isfinite(loss))
    assert all(v.shape == () and bool(jnp.isfinite(v)) for v in met.values())
    # On-policy, no controls: d loss / d logp_t = -A_t / N_tok on valid tokens.
    g = _grad_plain_jit(d["logp"], d["adv"], d["mask"])
    want = -jnp.where(d["mask"], d["adv"][..., None], 0.0) / d["mask"].sum()
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


_full_loss_jit = jax.jit(_full_loss, static_argnames="cov_control")
_grad_plain_jit = jax.jit(jax.grad(lambda lp, adv, m: obj.policy_loss(lp, lp, adv, m)[0]))


@pytest.mark.parametrize("cov_control", ["clip_cov", "kl_cov"])
def test_jit_and_eager_agree(cov_control):
    d = random_tokens(6)
    args = (d["logp"], d["old"], d["adv"], d["mask"], d["ref"], d["ent"], jax.random.key(0))
    eager = _full_loss(*args, cov_control=cov_control)
    jitted = _full_loss_jit(*args, cov_control=cov_control)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), eager, jitted)
    r, m = random_rollouts(6)
    key = jax.random.key(1)
    eager_v = obj.vpo_advantages(key, r, m, num_weights=64)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        eager_v,
        _vpo_jit(r, m, key),
    )


def _everything(logp, old, adv, mask, ref, ent, rewards, sol_mask, key):
    """Every global token selection and the VPO advantage, in one program (one compile)."""
    out = {}
    for cc in ("clip_cov", "kl_cov"):
        f = lambda lp, cc=cc: _full_loss(lp, old, adv, mask, ref, ent, key, cov_control=cc)  # noqa: E731
        (loss, met), grad = jax.value_and_grad(f, has_aux=True)(logp)
        out[cc] = (loss, met, grad)
    out["vpo"] = obj.vpo_advantages(key, rewards, sol_mask, num_weights=64, sampler="lattice")
    return out


@functools.cache
def _everything_unsharded():
    d = random_tokens(7, b=8)
    r, m = random_rollouts(7, b=8)
    args = (d["logp"], d["old"], d["adv"], d["mask"], d["ref"], d["ent"], r, m)
    return jax.jit(_everything)(*args, jax.random.key(0))


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_sharded_on_8_devices_equals_unsharded(axis_type):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((8,), ("data",), axis_types=(getattr(jax.sharding.AxisType, axis_type),))
    d = random_tokens(7, b=8)  # one prompt per device
    r, m = random_rollouts(7, b=8)
    args = (d["logp"], d["old"], d["adv"], d["mask"], d["ref"], d["ent"], r, m)
    shard = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))  # noqa: E731
    single = _everything_unsharded()
    with jax.set_mesh(mesh):
        sharded = jax.jit(_everything)(*map(shard, args), jax.random.key(0))
    assert sharded["clip_cov"][2].sharding.spec[0] == "data"  # the gradient stays sharded
    assert float(single["clip_cov"][1]["clip_cov_frac"]) > 0
    assert float(single["kl_cov"][1]["kl_cov_frac"]) > 0
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), single, sharded
    )
