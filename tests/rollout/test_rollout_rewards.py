"""vpo.rollout.rewards: the one estimator table (names, what each estimator sees, dispatch to the
objective functions), the estimator inputs, group variation for dynamic sampling, and the
solved predicate pass@k training sees.

Small eager arrays only (B=3 prompts, G=4 samples, M=2 answers, R=2 components).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo import objectives as obj
from vpo.config import ADVANTAGES, ObjectiveConfig
from vpo.objectives import estimators
from vpo.rollout import rewards
from vpo.tasks import make_task

B, G, M, R = 3, 4, 2, 2
W_R = np.array([0.5, 0.5], np.float32)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    r = jnp.asarray(rng.integers(0, 3, (B, G, M, R)) / 2.0, jnp.float32)
    smask = jnp.asarray(rng.uniform(size=(B, G, M)) < 0.7)
    penalty = jnp.asarray(-rng.integers(0, 2, (B, G)) * 0.25, jnp.float32)
    solved = jnp.asarray(rng.uniform(size=(B, G)) < 0.5)
    return r, smask, penalty, solved


def test_table_holds_every_configurable_name_and_nothing_else():
    assert tuple(estimators.ESTIMATORS) == ADVANTAGES
    assert {e.sees for e in estimators.ESTIMATORS.values()} == {
        "scalar", "components", "vectors", "correct"}


def test_estimator_inputs():
    r, smask, penalty, solved = batch()
    scalar = rewards.scalarize(r, smask, W_R) + penalty
    comps = jnp.sum(jnp.where(smask[..., None], r, 0.0), 2) + penalty[..., None]
    want = {"scalar": scalar, "components": comps, "vectors": r + penalty[..., None, None],
            "correct": solved.astype(jnp.float32)}
    for name, est in estimators.ESTIMATORS.items():
        x = rewards.estimator_input(rewards.estimator_of(ObjectiveConfig(advantage=name)), r,
                                    smask, W_R, penalty, solved)
        np.testing.assert_allclose(x, want[est.sees], err_msg=name)
    with pytest.raises(ValueError, match="solved_BG"):
        rewards.estimator_input(rewards.estimator_of(ObjectiveConfig(advantage="passk")), r,
                                smask, W_R, penalty)


def direct(name, cfg, r, smask, penalty, solved, key):
    """What each name means, spelled out with the public objective functions."""
    scalar = rewards.scalarize(r, smask, W_R) + penalty
    comps = jnp.sum(jnp.where(smask[..., None], r, 0.0), 2) + penalty[..., None]
    return {
        "grpo": lambda: obj.grpo_advantages(scalar),
        "dr_grpo": lambda: obj.grpo_advantages(scalar, scale="none"),
        "rloo": lambda: obj.rloo_advantages(scalar),
        "maxrl": lambda: obj.maxrl_advantages(scalar),
        "gdpo": lambda: obj.gdpo_advantages(comps, weights_R=W_R),
        "vpo": lambda: obj.vpo_advantages(key, r + penalty[..., None, None], smask,
                                          num_weights=cfg.num_weights),
        "maxk": lambda: obj.max_at_k_advantages(scalar, 2, std_normalize=True, std="unbiased"),
        "passk": lambda: obj.pass_at_k_advantages(solved, 2),
        "rw_grpo": lambda: obj.random_weight_grpo_advantages(key, comps),
    }[name]()[0]


@jax.jit
def _every_estimator(r, smask, penalty, solved, key):
    """Per name: (adv by the table, adv spelled out, adv and group_varies of constant groups);
    one compile for the whole table."""
    same = [jnp.broadcast_to(x[:, :1], x.shape) for x in (r, smask, penalty, solved)]
    out = {}
    for name in ADVANTAGES:
        cfg = ObjectiveConfig(advantage=name, num_weights=16)
        adv, metrics = rewards.advantages(cfg, r, smask, W_R, key, penalty, solved)
        adv0, _ = rewards.advantages(cfg, same[0], same[1], W_R, key, same[2], same[3])
        varies0 = rewards.group_varies(cfg, same[0], same[1], W_R, same[2], same[3])
        out[name] = (adv, direct(name, cfg, r, smask, penalty, solved, key), adv0, varies0,
                     metrics)
    return out


@functools.cache
def every_estimator():
    return _every_estimator(*batch(1), jax.random.key(3))


@pytest.mark.parametrize("name", ADVANTAGES)
def test_dispatch_matches_the_objective_function(name):
    adv, want, adv0, varies0, metrics = every_estimator()[name]
    assert adv.shape == (B, G) and bool(jnp.all(jnp.isfinite(adv)))
    assert isinstance(metrics, dict)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6, err_msg=name)
    # a group whose samples all look the same to the estimator has zero advantage, and
    # `group_varies` says so (the group dynamic sampling drops)
    np.testing.assert_allclose(adv0, 0.0, atol=1e-6, err_msg=name)
    assert not bool(jnp.any(varies0))


# a value other than the default for each estimator-specific field
_OTHER = {"grpo_scale": "batch", "grpo_std": "population", "num_weights": 5, "alpha": 0.2,
          "weight_sampler": "lattice", "subset_k": 3}


@jax.jit
def _with_each_field_changed(r, smask, penalty, solved, key):
    """Per (estimator, field): (adv with the defaults, adv with the field set to `_OTHER`)."""
    out = {}
    for name in ADVANTAGES:
        base = rewards.advantages(ObjectiveConfig(advantage=name), r, smask, W_R, key, penalty,
                                  solved)[0]
        for field, value in _OTHER.items():
            cfg = ObjectiveConfig(advantage=name, **{field: value})
            out[name, field] = base, rewards.advantages(cfg, r, smask, W_R, key, penalty,
                                                        solved)[0]
    return out


def test_reads_lists_exactly_the_fields_each_estimator_uses():
    # `vpo train` refuses a given field the chosen estimator does not read: each `reads` set
    # must hold every field that changes that estimator's advantages, and only those
    assert set(_OTHER) == estimators.ESTIMATOR_FIELDS
    rng = np.random.default_rng(5)  # 4 groups of 8: continuous rewards, so every field shows
    r = jnp.asarray(rng.uniform(size=(4, 8, M, R)), jnp.float32)
    smask = jnp.asarray(rng.uniform(size=(4, 8, M)) < 0.8)
    solved = jnp.asarray(rng.uniform(size=(4, 8)) < 0.5)
    got = _with_each_field_changed(r, smask, jnp.zeros((4, 8), jnp.float32), solved,
                                   jax.random.key(0))
    for (name, field), (base, changed) in got.items():
        moved = not np.allclose(base, changed, atol=1e-6)
        assert moved == (field in estimators.ESTIMATORS[name].reads), (name, field)


def test_group_varies_sees_what_the_estimator_sees():
    # two samples whose valid answers hold the same vectors in a different order (rows swapped)
    r = jnp.asarray([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]])  # 1 2 2 2
    smask = jnp.ones((1, 2, 2), bool)
    pen = jnp.zeros((1, 2))
    for name, varies in (("grpo", False), ("rw_grpo", False), ("gdpo", False), ("vpo", True)):
        got = rewards.group_varies(ObjectiveConfig(advantage=name), r, smask, W_R, pen)
        assert bool(got[0]) == varies, name
    solved = jnp.asarray([[True, False]])
    assert bool(rewards.group_varies(ObjectiveConfig(advantage="passk"), r, smask, W_R, pen,
                                     solved)[0])


def test_solved_counts_only_valid_answers():
    task = make_task("bandit", max_answers=2)  # solved: w*ᵀr >= 0.6
    r = jnp.asarray([[[[1.0, 0.0], [0.6, 0.6]], [[0.6, 0.6], [0.0, 0.0]]]])  # 1 2 2 2
    smask = jnp.asarray([[[True, False], [False, True]]])
    want = [bool(task.solved(r[0, 0, 0])), bool(task.solved(r[0, 1, 1]))]
    np.testing.assert_array_equal(rewards.solved(task, r, smask)[0], want)
    np.testing.assert_array_equal(rewards.solved(task, r, jnp.zeros_like(smask))[0], False)
