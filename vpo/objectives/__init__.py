"""The importable objective: pure, jittable advantage estimators and the policy-gradient loss.

Depends only on jax, numpy and the name tables of `vpo.config` (plain tuples): no model, trainer
or config objects. Every function takes masks,
documents shapes with the dimension key (B prompts, G samples per prompt, M answers per sample,
R reward components, K Dirichlet weight draws, T generated tokens) and returns `(value, metrics)`
where it is a loss (and for `vpo_advantages`, which logs the authors' diagnostics).

```python
from vpo import objectives
adv_BG, m = objectives.vpo_advantages(rewards_BGMR, solution_mask_BGM, key=key)   # VPO
adv_BG = objectives.grpo_advantages(rewards_BG, scale="group")                     # GRPO
loss, m = objectives.policy_loss(logp_BGT, old_logp_BGT, adv_BG, mask_BGT, clip_eps_high=0.28)
```
Gradient accumulation: pass `loss_denominator=objectives.loss_denominator(full_mask_BGT, agg)` to
each micro-batch call; the micro-batch losses then sum to the full-batch loss.

References (arXiv): VPO 2605.22817, GRPO 2402.03300, Dr. GRPO 2503.20783, DAPO 2503.14476,
GSPO 2507.18071, Clip-Cov/KL-Cov 2505.22617, high-entropy minority 2506.01939, GDPO 2601.05242,
MaxRL 2602.02710, Max@k 2510.23393, best-of-group pass@k 2503.19595, pass@k training
(analytic) 2508.10751, RLOO 2402.14740.
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
from vpo.objectives.policy_loss import AGG_MODES, kl_estimate, loss_denominator, policy_loss
from vpo.objectives.vpo import (
    dirichlet_weights,
    expected_max,
    random_weight_grpo_advantages,
    vpo_advantages,
)

__all__ = [
    "AGG_MODES",
    "best_of_group_advantages",
    "dirichlet_weights",
    "expected_max",
    "gdpo_advantages",
    "grpo_advantages",
    "kl_estimate",
    "loss_denominator",
    "max_at_k_advantages",
    "maxrl_advantages",
    "pass_at_k_advantages",
    "policy_loss",
    "random_weight_grpo_advantages",
    "rloo_advantages",
    "vpo_advantages",
]
