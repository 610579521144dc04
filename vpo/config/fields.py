"""Validation shared by every config section: the name tables of name-valued fields, `Rule`
and `validate`, and `require` for cross-field checks; errors name the field and the fix.

Every name-valued field has one table of valid names here; the modules that act on a name
(`vpo.objectives`, the sampler, the search) take their names from these tables, so an unknown
name is a `ConfigError` that lists the valid ones, raised before any array exists. This module
imports nothing heavy (no jax): the objective modules import their tables from it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from vpo.errors import ConfigError  # noqa: F401  (re-exported: vpo.config.ConfigError)

# -- name tables: the one list of valid names of each name-valued field ------------------------

DTYPES = ("float32", "bfloat16", "float16")
# Advantage estimators; `vpo.objectives.estimators.ESTIMATORS` maps each to its function, in
# this order.
ADVANTAGES = ("grpo", "dr_grpo", "rloo", "maxrl", "gdpo", "vpo", "maxk", "passk", "rw_grpo")
GRPO_SCALES = ("group", "batch", "none")
STD_MODES = ("unbiased", "population")
WEIGHT_SAMPLERS = ("iid", "lattice")
RATIO_LEVELS = ("token", "sequence")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
COV_CONTROLS = ("none", "clip_cov", "kl_cov")
# Rollout importance-sampling corrections of a stale rollout (`vpo.rl.offpolicy`).
ROLLOUT_IS = ("none", "token_tis", "seq_mis")
SCHEDULES = ("constant", "cosine")
# "auto": the Pallas kernel where it compiles and was measured faster (`vpo.kernels.choice`)
LOGPROB_IMPLS = ("auto", "chunked", "pallas", "reference")
KERNEL_CHOICES = ("auto", "pallas", "xla")  # `ModelConfig.decode_attention`
SELECTIONS = ("tournament", "boltzmann")  # search parent selection
# The policy-gradient objectives of the island search that learns (`vpo.search.learn`).
LEARN_OBJECTIVES = ("grpo", "vpo", "entropic")


# -- validation: one helper for every section --------------------------------------------------

def require(cond: bool, field: str, msg: str) -> None:
    """`ConfigError("field: msg")` unless `cond`: the one way a config reports a bad value."""
    if not cond:
        raise ConfigError(f"{field}: {msg}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one field accepts. kind "int" / "real": a finite number in the range [lo, hi]
    (`lo_open` / `hi_open` make an end open; None: unbounded); "bool"; "text": a string;
    "name": one of `names`.
    `optional`: None is accepted too."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    names: tuple[str, ...] = ()
    optional: bool = False

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "text":
            return "a string" + (" (or None)" if self.optional else "")
        if self.kind == "name":
            return "one of " + ", ".join(self.names) + (" (or None)" if self.optional else "")
        what = "an integer" if self.kind == "int" else "a finite number"
        if self.lo is not None and self.hi is not None:
            lo, hi = "(["[not self.lo_open], ")]"[not self.hi_open]
            what += f" in {lo}{self.lo:g}, {self.hi:g}{hi}"
        elif self.lo is not None:
            what += f" {'>' if self.lo_open else '>='} {self.lo:g}"
        elif self.hi is not None:
            what += f" {'<' if self.hi_open else '<='} {self.hi:g}"
        return what + (" (or None)" if self.optional else "")

    def accepts(self, value) -> bool:
        if value is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "text":
            return isinstance(value, str)
        if self.kind == "name":
            return isinstance(value, str) and value in self.names
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.kind == "int" and not isinstance(value, numbers.Integral):
            return False
        if not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)


def integer(lo: float | None = None, hi: float | None = None, *, optional: bool = False) -> Rule:
    return Rule("int", lo, hi, optional=optional)


def real(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
         hi_open: bool = False, optional: bool = False) -> Rule:
    return Rule("real", lo, hi, lo_open, hi_open, optional=optional)


def one_of(names: tuple[str, ...], *, optional: bool = False) -> Rule:
    return Rule("name", names=tuple(names), optional=optional)


FLAG = Rule("bool")
TEXT = Rule("text")
POSITIVE = integer(1)  # sizes and counts
FRACTION = real(0.0, 1.0, lo_open=True)  # (0, 1]


def validate(section: str, config, rules: dict[str, Rule]) -> None:
    """Checks every field named in `rules` (a table per config class); the first bad value
    raises `ConfigError("section.field: must be ...; got value")` (just "field" when
    `section` is empty: the run's top-level fields)."""
    for field, rule in rules.items():
        value = getattr(config, field)
        require(rule.accepts(value), f"{section}.{field}" if section else field,
                 f"must be {rule.describe()}; got {value!r}")
