"""`vpo.tree_ops`: the skipped-update step the RL step and SFT share."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vpo.tree_ops import all_finite, update_if


def test_update_if_applies_or_skips_without_copying_the_optimiser_state():
    """`tree_ops.update_if`: the optax step when finite, the old trees when not, and compiled
    with the state donated it writes Adam's moments in place (a select between new and old
    trees made XLA copy every moment and parameter first: 4 copies for these two leaves)."""
    tx = optax.adamw(1e-2)
    params = {"w": jnp.linspace(-1.0, 1.0, 64 * 64).reshape(64, 64), "b": jnp.zeros(64)}
    grads = jax.tree.map(lambda x: 0.1 + 0.01 * x, params)
    opt = tx.init(params)
    updates, want_opt = tx.update(grads, opt, params)
    want = optax.apply_updates(params, updates)
    got, got_opt = update_if(jnp.bool_(True), tx, grads, opt, params)
    kept, kept_opt = update_if(jnp.bool_(False), tx, grads, opt, params)
    for a, b in zip(jax.tree.leaves((got, got_opt)), jax.tree.leaves((want, want_opt)),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # fused vs eager rounding
    for a, b in zip(jax.tree.leaves((kept, kept_opt)), jax.tree.leaves((params, opt)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    step = jax.jit(lambda p, o, g, ok: update_if(ok, tx, g, o, p), donate_argnums=(0, 1))
    hlo = step.lower(params, opt, grads, jnp.bool_(True)).compile().as_text()
    assert not re.findall(r"= f32\[[0-9,]*\]\{[0-9,]*\} copy\(", hlo)


def test_all_finite_sees_one_bad_element_in_any_leaf():
    tree = {"a": jnp.ones((3, 4)), "b": jnp.zeros(5)}
    assert bool(all_finite(tree))
    for bad in (jnp.nan, jnp.inf):
        assert not bool(all_finite({**tree, "b": tree["b"].at[2].set(bad)}))
