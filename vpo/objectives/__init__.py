"""The importable objective: pure, jittable advantage estimators and the policy-gradient loss.

Imports only jax, numpy and the name tables of `vpo.config` (plain tuples): no model, trainer,
optimiser or config objects (`pip install --no-deps vpo jax` is enough; docs/objective.md).
Dimension key: B prompts, G samples per prompt, M answers per sample, R reward components,
K Dirichlet weight draws, T generated tokens.

Conventions:
- Every advantage estimator returns `(adv_BG, metrics)`, and so does `policy_loss`
  (`(loss, metrics)`); metrics are scalar arrays (random-weight GRPO adds its [B, R] weights).
- Functions that always draw random numbers take the PRNG key first, as `jax.random` does:
  `dirichlet_weights(key, ...)`, `vpo_advantages(key, ...)`,
  `random_weight_grpo_advantages(key, ...)` and every `get_estimator(...)` function
  `(key, rewards, ...)`. `policy_loss` draws only with `cov_control="clip_cov"` and takes the
  key as `key=`. The deterministic estimators take no key.
- Masks are optional, None meaning every entry is valid: `mask_BG` of every estimator and VPO's
  answer mask `solution_mask_BGM` (`vpo_advantages(key, rewards_BGMR)`, and its estimator form).
- Arrays are grouped, `[B, G, ...]`; a flat `[B·G, ...]` one (TRL's rows) is refused with the fix,
  `to_groups(x, G)`.
- Bad values, the same in every estimator: a non-finite reward of a valid rollout raises
  `vpo.errors.RewardError` in an eager call; under jit / vmap / grad that group's advantages
  are NaN and `metrics["adv/nonfinite_rewards"]` counts them. Padding (mask False) is ignored.
  Rewards are not range-checked (VPO's and GRPO's advantages are unchanged by `r -> a r + c`,
  a > 0). Explicit Dirichlet weights off the simplex raise ValueError eagerly and are counted
  in `metrics["adv/bad_weights"]` under jit; a traced `alpha <= 0` gives NaN weights, hence NaN
  advantages.

```python
import jax, jax.numpy as jnp
from vpo import objectives

key = jax.random.key(0)
rewards_BGMR = jax.random.uniform(key, (2, 4, 1, 3))       # 2 prompts x 4 samples, 3 rewards
solution_mask_BGM = jnp.ones((2, 4, 1), bool)
adv_BG, m = objectives.vpo_advantages(key, rewards_BGMR, solution_mask_BGM)   # VPO
adv_BG, m = objectives.grpo_advantages(rewards_BGMR.mean((2, 3)), scale="group")  # GRPO
logp_BGT = jnp.zeros((2, 4, 5)); mask_BGT = jnp.ones((2, 4, 5), bool)
loss, m = objectives.policy_loss(logp_BGT, logp_BGT, adv_BG, mask_BGT,
                                 **objectives.LOSS_SETTINGS["dapo"])   # no ref: kl_coef 0
```
Gradient accumulation: pass `loss_denominator=objectives.loss_denominator(full_mask_BGT, agg)` to
each micro-batch call; the micro-batch losses then sum to the full-batch loss.

References (arXiv): VPO 2605.22817, GRPO 2402.03300, Dr. GRPO 2503.20783, DAPO 2503.14476,
GSPO 2507.18071, Clip-Cov/KL-Cov 2505.22617, high-entropy minority 2506.01939, GDPO 2601.05242,
MaxRL 2602.02710, Max@k 2510.23393, best-of-group pass@k 2503.19595, pass@k training
(analytic) 2508.10751, RLOO 2402.14740, the entropic advantage of TTT-Discover 2601.16175
(`entropic_advantages`: test-time RL inside the island search, `vpo.search.learn`).
"""

from vpo.objectives.advantages import (
    best_of_group_advantages,
    gdpo_advantages,
    grpo_advantages,
    max_at_k_advantages,
    maxrl_advantages,
    pass_at_k_advantages,
    rloo_advantages,
)
from vpo.objectives.entropic import entropic_advantages, entropic_beta
from vpo.objectives.estimators import (
    BoundEstimator,
    estimator_names,
    estimator_options,
    get_estimator,
)
from vpo.objectives.layout import from_groups, to_groups
from vpo.objectives.policy_loss import (
    AGG_MODES,
    LOSS_FIELDS,
    LOSS_SETTINGS,
    VPO_PAPER_LOSS,
    kl_estimate,
    loss_denominator,
    loss_options,
    policy_loss,
)
from vpo.objectives.vpo import (
    dirichlet_weights,
    expected_max,
    random_weight_grpo_advantages,
    vpo_advantages,
)

__all__ = [
    "AGG_MODES",
    "LOSS_FIELDS",
    "LOSS_SETTINGS",
    "VPO_PAPER_LOSS",
    "BoundEstimator",
    "best_of_group_advantages",
    "dirichlet_weights",
    "entropic_advantages",
    "entropic_beta",
    "estimator_names",
    "estimator_options",
    "expected_max",
    "from_groups",
    "gdpo_advantages",
    "get_estimator",
    "grpo_advantages",
    "kl_estimate",
    "loss_denominator",
    "loss_options",
    "max_at_k_advantages",
    "maxrl_advantages",
    "pass_at_k_advantages",
    "policy_loss",
    "random_weight_grpo_advantages",
    "rloo_advantages",
    "to_groups",
    "vpo_advantages",
]
