"""Bandit toy: GRPO puts every answer slot on the compromise, VPO spreads slots over the corners.

Three fixed answers with reward vectors (1, 0), (0, 1), (0.6, 0.6). A "rollout" fills m slots, each
slot drawn from its own softmax policy over the three answers. Both methods train the slot logits
with REINFORCE (G rollouts per step, plain gradient ascent, lr 0.1, 300 steps):

- GRPO: scalar reward = mean over the m answers of the component mean (0.5, 0.5, 0.6), z-scored.
  The compromise is best for every slot, so every slot collapses onto it: E_w[max] = 0.60.
- VPO: reward = E_{w~Dir(1)}[max_j w . r_j] over the rollout's m answers, group z-score. A set that
  holds both corners scores 0.75 (0.76 with the compromise too), so slots specialise.

VPO's bandit toy (Bahlous-Boldi et al., arXiv 2605.22817; the authors' notebooks/01). The whole
training loop is one jitted `lax.scan`; the final E_w[max] is exact (all 3^m slot combinations,
midpoint quadrature over w).

Run:  .venv/bin/python experiments/bandit_toy.py
"""

from __future__ import annotations

import functools
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

from vpo import objectives

ANSWERS_AR = ((1.0, 0.0), (0.0, 1.0), (0.6, 0.6))
ANSWER_NAMES = ("(1,0)", "(0,1)", "(.6,.6)")


def get_config() -> dict:
    return dict(
        num_slots=4,  # m answers per rollout
        group_size=16,  # G rollouts per step
        lr=0.1,
        steps=300,
        num_weights=100,  # K Dirichlet draws per step for VPO
        alpha=1.0,
        seed=0,
    )


def train(method: str, cfg: dict, key: jax.Array) -> jax.Array:
    """Returns the final slot logits_MA after `cfg["steps"]` REINFORCE steps with `method`."""
    M, G = cfg["num_slots"], cfg["group_size"]
    rewards_AR = jnp.asarray(ANSWERS_AR)
    solution_mask_1GM = jnp.ones((1, G, M), bool)

    def advantages(r_GMR, key):
        if method == "grpo":
            return objectives.grpo_advantages(r_GMR.mean((1, 2))[None])[0][0]
        adv_1G, _ = objectives.vpo_advantages(
            key,
            r_GMR[None],
            solution_mask_1GM,
            num_weights=cfg["num_weights"],
            alpha=cfg["alpha"],
        )
        return adv_1G[0]

    def step(logits_MA, key):
        k_sample, k_weights = jax.random.split(key)
        answers_GM = jax.random.categorical(k_sample, logits_MA, shape=(G, M))
        adv_G = advantages(rewards_AR[answers_GM], k_weights)

        def surrogate(logits_MA):
            logp_MA = jax.nn.log_softmax(logits_MA)
            logp_GM = jnp.take_along_axis(logp_MA[None], answers_GM[..., None], axis=-1)[..., 0]
            return jnp.mean(adv_G * logp_GM.sum(-1))

        return logits_MA + cfg["lr"] * jax.grad(surrogate)(logits_MA), None

    logits_MA = jnp.zeros((M, len(ANSWERS_AR)))
    logits_MA, _ = jax.lax.scan(step, logits_MA, jax.random.split(key, cfg["steps"]))
    return logits_MA


def policy_expected_max(probs_MA: np.ndarray) -> float:
    """Exact E_{slots}[E_w[max_j w . r_j]] over all A^M slot combinations (d = 2 quadrature)."""
    M, A = probs_MA.shape
    combos_CM = np.asarray(list(itertools.product(range(A), repeat=M)))
    p_C = np.prod(probs_MA[np.arange(M)[None], combos_CM], axis=-1)
    t = (np.arange(1000) + 0.5) / 1000
    weights_1KR = jnp.asarray(np.stack([t, 1 - t], -1)[None], jnp.float32)
    r_1CMR = jnp.asarray(np.asarray(ANSWERS_AR)[combos_CM][None], jnp.float32)
    raw_C = objectives.expected_max(r_1CMR, jnp.ones(r_1CMR.shape[:3], bool), weights_1KR)[0]
    return float(np.sum(p_C * np.asarray(raw_C)))


def main(cfg: dict | None = None) -> dict:
    cfg = get_config() if cfg is None else cfg
    key = jax.random.key(cfg["seed"])
    out = {}
    for method in ("grpo", "vpo"):
        t0 = time.perf_counter()
        logits_MA = jax.jit(functools.partial(train, method, cfg))(key)
        probs_MA = np.asarray(jax.nn.softmax(logits_MA))
        seconds = time.perf_counter() - t0
        out[method] = dict(probs_MA=probs_MA, expected_max=policy_expected_max(probs_MA))
        print(
            f"\n{method.upper()}  ({cfg['steps']} steps, G={cfg['group_size']}, "
            f"m={cfg['num_slots']}, lr={cfg['lr']}; compile+train {seconds:.1f}s)"
        )
        print("  slot  " + "  ".join(f"{n:>8}" for n in ANSWER_NAMES))
        for m, p in enumerate(probs_MA):
            print(f"  {m:>4}  " + "  ".join(f"{x:8.3f}" for x in p))
        print(f"  E_w[max] of the policy's answer set: {out[method]['expected_max']:.3f}")
    print("\nreference: all-compromise 0.600, both corners 0.750, corners + compromise 0.760")
    return out


if __name__ == "__main__":
    main()
