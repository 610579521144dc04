"""VPO on vector rewards, step by step, next to GRPO on a fixed scalarisation.

Each of 2 prompts gets 4 samples; each sample gives up to 2 answers scored on 2 objectives
that conflict (answer a is good on the first, b on the second). GRPO on the mean reward sees
nothing to prefer between a sample with two specialised answers and one with two average
ones; VPO credits the sample whose answers cover more of the trade-off.

    python examples/objective/vpo_vector_rewards.py
"""

import jax
import jax.numpy as jnp
import numpy as np

from vpo import objectives


def main():
    # rewards_BGMR: B=2 prompts, G=4 samples, M=2 answers, R=2 objectives in [0, 1]
    specialised = [[1.0, 0.0], [0.0, 1.0]]  # one answer per objective
    average = [[0.5, 0.5], [0.5, 0.5]]  # two middling answers
    one_good = [[1.0, 0.0], [1.0, 0.0]]  # the same trade-off twice
    rewards_BGMR = jnp.asarray([[specialised, average, one_good, average]] * 2)
    solution_mask_BGM = jnp.ones((2, 4, 2), bool).at[1, 3, 1].set(False)  # one answer did not parse

    key = jax.random.key(0)
    vpo_adv_BG, metrics = objectives.vpo_advantages(key, rewards_BGMR, solution_mask_BGM)

    # the same through the table, by name (key first, like jax.random)
    vpo = objectives.get_estimator("vpo", num_weights=100, alpha=1.0)
    same_BG, _ = vpo(key, rewards_BGMR, solution_mask_BGM)
    assert jnp.allclose(same_BG, vpo_adv_BG)

    # GRPO on the fixed scalarisation w* = (1/2, 1/2), summed over the valid answers
    scalar_BG = jnp.sum(jnp.where(solution_mask_BGM, rewards_BGMR.mean(-1), 0.0), axis=-1)
    grpo_adv_BG, _ = objectives.grpo_advantages(scalar_BG)

    print("VPO  ", np.round(np.asarray(vpo_adv_BG), 2))
    print("GRPO ", np.round(np.asarray(grpo_adv_BG), 2))
    best = float(metrics["vpo/pool_expected_best"])
    print(f"E_w[max] of each group's pooled answers, mean over groups: {best:.3f}")
    assert vpo_adv_BG[0, 0] > vpo_adv_BG[0, 1]  # specialised answers beat average ones under VPO
    assert grpo_adv_BG[0, 0] == grpo_adv_BG[0, 1]  # ... and tie under GRPO on the mean
    return vpo_adv_BG


if __name__ == "__main__":
    main()
