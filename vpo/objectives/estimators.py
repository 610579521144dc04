"""Advantage estimators by name: `get_estimator(name, **options)` for library users, and the
table `ESTIMATORS` the RL step reads through an `ObjectiveConfig`. Both go through the same
functions with the same defaults.

```python
est = get_estimator("grpo", std="population")
adv_BG, metrics = est(key, rewards_BG)          # key unused by deterministic estimators
est.sees, est.options                            # "scalar", {"scale": "group", "std": ...}
```
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import jax.numpy as jnp

from vpo.config import ADVANTAGES
from vpo.objectives.advantages import (
    gdpo_advantages,
    grpo_advantages,
    max_at_k_advantages,
    maxrl_advantages,
    pass_at_k_advantages,
    rloo_advantages,
)
from vpo.objectives.vpo import random_weight_grpo_advantages, vpo_advantages

# What each estimator takes as `rewards` (its "sees"):
#   scalar      rewards_BG   one number per rollout
#   components  rewards_BGR  one reward vector per rollout
#   vectors     rewards_BGMR M answers per rollout, each a reward vector (+ solution_mask_BGM)
#   correct     correct_BG   bool (or 0/1) outcome per rollout
SEES = ("scalar", "components", "vectors", "correct")


class _Spec(NamedTuple):
    sees: str
    call: Callable  # (key, x, solution_mask_BGM, mask_BG, **options) -> (adv_BG, metrics)
    function: Callable  # the public estimator function whose defaults are the options'
    options: tuple[str, ...]  # option names (keyword arguments of `function`)
    fixed: Mapping = MappingProxyType({})  # arguments the name fixes (dr_grpo: scale="none")
    fields: Mapping = MappingProxyType({})  # option -> the `ObjectiveConfig` field it comes from


def _scalar(fn):
    return lambda key, x, smask, mask_BG, **o: fn(x, mask_BG=mask_BG, **o)


_SPECS: dict[str, _Spec] = {
    # GRPO, arXiv 2402.03300
    "grpo": _Spec("scalar", _scalar(grpo_advantages), grpo_advantages, ("scale", "std", "eps"),
                  fields=MappingProxyType({"scale": "grpo_scale", "std": "grpo_std"})),
    # Dr. GRPO, arXiv 2503.20783: GRPO without the std division
    "dr_grpo": _Spec("scalar", _scalar(grpo_advantages), grpo_advantages, ("std", "eps"),
                     fixed=MappingProxyType({"scale": "none"})),
    # RLOO, arXiv 2402.14740
    "rloo": _Spec("scalar", _scalar(rloo_advantages), rloo_advantages, ()),
    # MaxRL, arXiv 2602.02710
    "maxrl": _Spec("scalar", _scalar(maxrl_advantages), maxrl_advantages, ("eps",)),
    # GDPO, arXiv 2601.05242
    "gdpo": _Spec("components", _scalar(gdpo_advantages), gdpo_advantages,
                  ("weights_R", "std", "eps"), fields=MappingProxyType({"std": "grpo_std"})),
    # VPO, arXiv 2605.22817
    "vpo": _Spec("vectors",
                 lambda key, x, smask, mask_BG, **o: vpo_advantages(
                     key if o.get("weights_BKR") is None else None, x, smask,
                     mask_BG=mask_BG, **o),
                 vpo_advantages, ("num_weights", "alpha", "sampler", "weights_BKR", "eps"),
                 fields=MappingProxyType({"num_weights": "num_weights", "alpha": "alpha",
                                          "sampler": "weight_sampler"})),
    # Max@k, arXiv 2510.23393 (verl, std-normalised)
    "maxk": _Spec("scalar", _scalar(max_at_k_advantages), max_at_k_advantages,
                  ("k", "std_normalize", "std", "eps"),
                  fields=MappingProxyType({"k": "subset_k", "std": "grpo_std"})),
    # pass@k training (analytic), arXiv 2508.10751
    "passk": _Spec("correct", _scalar(pass_at_k_advantages), pass_at_k_advantages, ("k", "eps"),
                   fields=MappingProxyType({"k": "subset_k"})),
    # random-weight GRPO, the VPO paper's baseline (arXiv 2605.22817)
    "rw_grpo": _Spec("components",
                     lambda key, x, smask, mask_BG, **o: random_weight_grpo_advantages(
                         key if o.get("weights_BR") is None else None, x, mask_BG=mask_BG, **o),
                     random_weight_grpo_advantages,
                     ("alpha", "weights_BR", "scale", "std", "eps"),
                     fields=MappingProxyType({"alpha": "alpha", "scale": "grpo_scale",
                                              "std": "grpo_std"})),
}


def _defaults(spec: _Spec) -> dict:
    params = inspect.signature(spec.function).parameters
    return {name: params[name].default for name in spec.options}


@dataclasses.dataclass(frozen=True, eq=False)
class BoundEstimator:
    """An estimator with its options bound: `est(key, rewards, solution_mask_BGM=None, *,
    mask_BG=None) -> (adv_BG, metrics)`, a pure jittable function.

    name: the table's name. sees: what `rewards` is ("scalar" rewards_BG, "components"
    rewards_BGR, "vectors" rewards_BGMR with `solution_mask_BGM` (default: every answer valid),
    "correct" correct_BG). options: every option with its value (the function's default unless
    given). key: a PRNG key; vpo and rw_grpo draw Dirichlet weights with it, the others ignore it
    (None is fine there). Hashable by identity, so `jax.jit(est)` works.
    """

    name: str
    sees: str
    options: Mapping
    fn: Callable

    def __call__(self, key, rewards, solution_mask_BGM=None, *, mask_BG=None):
        return self.fn(key, rewards, solution_mask_BGM, mask_BG)


def estimator_names() -> tuple[str, ...]:
    """Every name `get_estimator` accepts (the table's order)."""
    return tuple(_SPECS)


def estimator_options(name: str) -> dict:
    """The options of estimator `name` and their defaults (those of its function)."""
    return _defaults(_spec(name))


def _spec(name: str) -> _Spec:
    if name not in _SPECS:
        raise ValueError(f"unknown estimator {name!r}; known: {', '.join(_SPECS)}")
    return _SPECS[name]


def get_estimator(name: str, **options) -> BoundEstimator:
    """The advantage estimator `name` (any of `estimator_names()`) with `options` bound.

    Returns a `BoundEstimator`: call it as `est(key, rewards, solution_mask_BGM=None, *,
    mask_BG=None)` to get `(adv_BG, metrics)`. Unknown options raise a ValueError listing the
    accepted ones; `estimator_options(name)` gives them with their defaults.
    """
    spec = _spec(name)
    unknown = set(options) - set(spec.options)
    if unknown:
        raise ValueError(f"estimator {name!r} takes options {list(spec.options)}; got unknown "
                         f"{sorted(unknown)}")
    bound = {**_defaults(spec), **options}
    call_opts = {**bound, **spec.fixed}

    def fn(key, rewards, solution_mask_BGM=None, mask_BG=None):
        return spec.call(key, rewards, solution_mask_BGM, mask_BG, **call_opts)

    return BoundEstimator(name, spec.sees, MappingProxyType(bound), fn)


class Estimator(NamedTuple):
    """One row of the RL step's table: the reward it sees and the function that turns it into
    adv_BG from an `ObjectiveConfig`.

    fn(cfg, x, solution_mask_BGM, weights_R, key) -> (adv_BG, metrics): `get_estimator(name,
    **options from cfg)`. reads: the estimator-specific `ObjectiveConfig` fields it uses (of
    `ESTIMATOR_FIELDS`).
    """

    sees: str
    fn: Callable
    reads: frozenset[str] = frozenset()


def _from_config(name: str) -> Callable:
    spec = _SPECS[name]

    def fn(cfg, x, smask, weights_R, key):
        options = {opt: getattr(cfg, field) for opt, field in spec.fields.items()}
        if name == "gdpo":  # the fixed scalarisation w* weighs GDPO's per-component z-scores
            options["weights_R"] = jnp.asarray(weights_R)
        adv_BG, metrics = get_estimator(name, **options)(key, x, smask)
        metrics = {k: v for k, v in metrics.items() if jnp.ndim(v) == 0}  # scalars are logged
        return adv_BG, metrics

    return fn


# The estimator table: `objective.advantage` → Estimator (names: `vpo.config.fields.ADVANTAGES`).
ESTIMATORS: dict[str, Estimator] = {
    name: Estimator(spec.sees, _from_config(name), frozenset(spec.fields.values()))
    for name, spec in _SPECS.items()
}


# The objective fields that belong to some estimators only (the rest serve every estimator).
ESTIMATOR_FIELDS = frozenset().union(*(e.reads for e in ESTIMATORS.values()))
if tuple(ESTIMATORS) != ADVANTAGES:  # one list of names: the config validates against it
    raise ImportError(f"vpo.objectives.estimators.ESTIMATORS {tuple(ESTIMATORS)} != "
                      f"vpo.config.ADVANTAGES "
                      f"{ADVANTAGES}")
