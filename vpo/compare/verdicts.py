"""The claims a `vpo compare` headline is judged on: those of the VPO and entropy papers
(`check`, exploratory) and the comparison's pre-registered primary claims (`primary_claims`,
at most `MAX_PRIMARY`, Holm over their own family), each a paired claim over training seeds
built from `vpo.eval.claims`' tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from vpo.eval.claims import (
    INCONCLUSIVE,
    at_seeds,
    compare_values,
    entropy_law_claim,
    gap_grows,
    holm,
    in_every_seed,
    make_claim,
    matched_seeds,
)

BASELINES = ("grpo", "maxk", "rw_grpo", "passk", "multi_rlvr")
ENTROPY_CONTROLS = ("clip_cov", "kl_cov", "gppo", "entropy_mask")


def _series(rows: Mapping[str, Any], row: str, metric: str | None = None
            ) -> tuple[list[int], list[float]] | None:
    """(seed ids, values) of one row's metric ({"seeds", "values": {metric: [...]}}, or
    {"seeds", "values": [...]} with metric None); None when the row or metric is absent."""
    r = rows.get(row)
    v = None if r is None else (r["values"] if metric is None else r["values"].get(metric))
    return None if v is None else (_seeds(rows, row), list(v))


def _seeds(rows: Mapping[str, Any], row: str) -> list[int]:
    if "seeds" not in rows[row]:
        raise ValueError(f"row {row!r} has no seed ids: claims pair rows by seed id")
    return list(rows[row]["seeds"])


def _paired(text: str, a, b, names, **kw) -> dict[str, Any]:
    """compare_values on two `_series`, matched by seed id."""
    return compare_values(text, a[1], b[1], names=names, seeds=(a[0], b[0]), **kw)


def _solving(head, a: str, b: str, metric: str) -> str:
    """The pass@k (solving) means beside a best@k claim, so a partial-credit gain is not read
    as solving; "" when the headline has no pass@k."""
    pa, pb = _series(head, a, metric), _series(head, b, metric)
    if pa is None or pb is None:
        return ""
    return f"; solving, {metric}: {np.mean(pa[1]):.3f} vs {np.mean(pb[1]):.3f}"


def check(head: Mapping[str, Any], ks: Sequence[int], *, law=None, search=None
          ) -> list[dict[str, Any]]:
    """The claims of the VPO and entropy papers on a `vpo compare` headline.

    head: {row: {"m": answers per generation, "seeds": [seed id], "values": {metric: [value per
      seed]}}} with metrics "best@k" for every k in `ks`, "diversity" (eval candidates), "train
      entropy", "train diversity" and optionally "pass@k"; rows are paired by seed id
      (`pair_by_seed`: different seed lists are a ValueError).
    law: {arm: [{"step", "entropy", "score"} per seed]} (held-out evaluation score over
      training); search: the output of `search_claim_inputs` ({row: {"seeds", "values"}}, per
      seed solved counts).
    Token-entropy and training-diversity claims compare arms with the same m only (token counts
    and group pool sizes differ with m). Claims whose arms did not run are left out. The list
    is Holm-adjusted as one family (`holm`).
    """
    N = ks[-1]
    out: list[dict[str, Any]] = []
    if "vpo" in head:
        mv = head["vpo"]["m"]
        for base in (b for b in BASELINES if b in head):
            names = ("vpo", base)
            c = _paired(f"VPO best@{N} > {base} best@{N} (equal candidate budget)",
                        _series(head, "vpo", f"best@{N}"), _series(head, base, f"best@{N}"),
                        names)
            c["evidence"] += _solving(head, "vpo", base, f"pass@{N}")
            out.append(c)
            seeds = matched_seeds(_seeds(head, "vpo"), _seeds(head, base), names=names,
                                  text=f"the best@k gap VPO - {base}")
            a_seed_k = np.transpose([at_seeds(*_series(head, "vpo", f"best@{k}"), seeds,
                                              name="vpo") for k in ks])
            b_seed_k = np.transpose([at_seeds(*_series(head, base, f"best@{k}"), seeds,
                                              name=base) for k in ks])
            out.append(gap_grows(f"the best@k gap VPO - {base} grows with k and is positive at "
                                 f"k={N}", a_seed_k, b_seed_k, ks, names=names))
            out.append(_paired(f"VPO's eval candidates have higher reward-space diversity "
                               f"than {base}'s", _series(head, "vpo", "diversity"),
                               _series(head, base, "diversity"), names))
            if head[base]["m"] == mv:
                for metric, what in (("train entropy", "token entropy"),
                                     ("train diversity", "reward-space diversity")):
                    a, b = _series(head, "vpo", metric), _series(head, base, metric)
                    if a is not None and b is not None:
                        out.append(_paired(
                            f"VPO keeps higher {what} of training rollouts (last 20% of steps) "
                            f"than {base} (both m={mv})", a, b, names))
            if search is not None and "vpo" in search and base in search:
                out.append(_paired(
                    f"in search at equal budget, VPO's policy solves more of the hard problems "
                    f"than {base}'s", _series(search, "vpo"), _series(search, base), names))
    for arm in (a for a in ENTROPY_CONTROLS if a in head):
        if "grpo" in head and head["grpo"]["m"] == head[arm]["m"]:
            a, b = _series(head, arm, "train entropy"), _series(head, "grpo", "train entropy")
            if a is not None and b is not None:
                out.append(_paired(f"{arm} keeps token entropy of training rollouts above "
                                   "plain GRPO (last 20% of steps)", a, b, (arm, "grpo")))
    if law and "grpo" in law:
        out.append(entropy_law_claim(
            "the entropy law R = -a·exp(H) + b predicts GRPO's held-out evaluation score from "
            "training entropy better than a linear-in-H fit, a trend in steps and a constant "
            "(fit on the early half, judged on the later half)", law["grpo"]))
    return holm(out)


def search_claim_inputs(solved_by_row: Mapping[str, Any], seeds: Mapping[str, Sequence[int]]
                        ) -> dict[str, dict[str, list]]:
    """Per row, the seed ids and the number of hard problems solved per training seed, averaged
    over search seeds: solved_by_row[row] is bool [training seed, search seed, problem] with
    training seed r = seeds[row][r] → {row: {"seeds": [...], "values": [per seed]}}."""
    out = {}
    for row, x in solved_by_row.items():
        values = np.asarray(x, float).sum(-1).mean(-1).tolist()
        if len(seeds[row]) != len(values):
            raise ValueError(f"search rows of {row}: {len(values)} training seeds, seed ids "
                             f"{list(seeds[row])}")
        out[row] = {"seeds": list(seeds[row]), "values": values}
    return out


# -- pre-registered primary claims ---------------------------------------------------------------

PRIMARY_ARMS = ("vpo", *BASELINES)  # the arms a primary claim may name
# best@k (partial credit), pass@k (solving), cover@k (a set hitting every mode), k the budget N
# or the key's own "@k"; diversity: mean pairwise reward-space distance of the held-out
# candidates; search: search problems solved by the policy's island search at the calibrated
# budget
PRIMARY_METRICS = ("best", "pass", "cover", "diversity", "search")
AT_K_METRICS = ("best", "pass", "cover")  # the metrics a key may evaluate at its own k
SEARCH = "search solved"  # the headline's per-seed search value
WARM = "warm"  # "A-warm:metric": arm A against its own warm start (same m)
MAX_PRIMARY = 3
# "A-B:metric[@k]/problem": the claim per held-out problem within each seed, for every seed
# (`vpo.eval.claims.in_every_seed`): a statement about each seed's checkpoint that the problems
# decide, so few seeds can (the precondition "RL learns" on a model too slow for many seeds)
PER_PROBLEM = "/problem"
_KEY = re.compile(r"^(?P<a>[a-z_]+)-(?P<b>[a-z_]+):(?P<metric>[a-z]+)(?:@(?P<k>[1-9][0-9]*))?$")


class PrimaryKey(NamedTuple):
    """One parsed primary key "A-B:metric[@k]" (k None: at the evaluation budget N)."""

    a: str
    b: str
    metric: str
    k: int | None


def per_problem(key: str) -> bool:
    """Whether a primary key claims per problem in every seed (`PER_PROBLEM`)."""
    return key.strip().endswith(PER_PROBLEM)


def parse_key(key: str) -> PrimaryKey:
    """"A-B:metric", "A-B:metric@k", either with "/problem" → PrimaryKey; a ValueError naming
    what is wrong."""
    text = key.strip().removesuffix(PER_PROBLEM)
    m = _KEY.match(text)
    if (not m or m["a"] not in PRIMARY_ARMS or m["b"] not in (*PRIMARY_ARMS, WARM)
            or m["a"] == m["b"] or m["metric"] not in PRIMARY_METRICS
            or (m["k"] and m["metric"] not in AT_K_METRICS)
            or (per_problem(key) and m["metric"] == "search")):
        raise ValueError(
            f"unknown primary claim {key!r}: write A-B:metric with A one of "
            f"{', '.join(PRIMARY_ARMS)}, B another or {WARM!r} (A's warm start), metric one of "
            f"{', '.join(PRIMARY_METRICS)}, and for {', '.join(AT_K_METRICS)} optionally @k "
            f"(at k candidates instead of the budget), then optionally {PER_PROBLEM} (per "
            "held-out problem in every seed; not for search), e.g. vpo-grpo:best, "
            "grpo-warm:pass@1 or grpo-warm:pass@1/problem")
    return PrimaryKey(m["a"], m["b"], m["metric"], int(m["k"]) if m["k"] else None)


def primary_keys(text: str) -> list[str]:
    """The comma-separated primary claim keys of a config, checked: each "A-B:metric[@k]"
    (claim: arm A's metric above B's, B an arm or "warm" for A's warm start; `parse_key`), none
    twice, at most MAX_PRIMARY; a ValueError naming the problem."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    for k in keys:
        parse_key(k)
    if len(set(keys)) != len(keys):
        raise ValueError(f"{text!r} names a primary claim twice")
    if len(keys) > MAX_PRIMARY:
        raise ValueError(f"{len(keys)} primary claims; at most {MAX_PRIMARY} (each one more "
                         "raises the seeds Holm needs)")
    return keys


def primary_ks(text: str) -> list[int]:
    """The k the primary keys name with "@k" (the evaluation must measure them)."""
    return sorted({p.k for p in map(parse_key, primary_keys(text)) if p.k})


def primary_text(key: str, N: int) -> str:
    """The claim a primary key states (the same words as the exploratory claim it replaces)."""
    if per_problem(key):
        return (primary_text(key.strip().removesuffix(PER_PROBLEM), N)
                + ", on the same held-out problems in every seed (paired over the problems "
                "within each seed)")
    a, b, metric, k = parse_key(key)
    name = "VPO" if a == "vpo" else a
    if metric == "search":
        if b == WARM:
            return f"{a}'s island search solves more of the hard problems than its warm start's"
        return (f"in search at equal budget, {name}'s policy solves more of the hard problems "
                f"than {b}'s")
    if metric == "diversity":
        if b == WARM:
            return (f"{a}'s held-out candidates have higher reward-space diversity than its "
                    "warm start's")
        return (f"{name}'s held-out candidates have higher reward-space diversity than {b}'s "
                f"({N} candidates per problem each)")
    at = f"{metric}@{k or N}"
    if b == WARM:
        return f"{a} {at} above its warm start's"
    return f"{name} {at} > {b} {at} (equal candidate budget)"


def metric_key(key: str, N: int) -> str:
    """The headline metric a primary key compares ("pass@30", "search solved", ...)."""
    _, _, metric, k = parse_key(key)
    if metric in ("search", "diversity"):
        return SEARCH if metric == "search" else "diversity"
    return f"{metric}@{k or N}"


def stronger_warm_start(head: Mapping[str, Any], metric: str) -> str | None:
    """The warm-start row ("sft (m=...)") with the higher mean of `metric` over its seeds: the
    stronger of its single-answer and m-answer modes; None when no warm-start row has it."""
    rows = [r for r in head if r.startswith("sft") and metric in head[r]["values"]]
    return max(rows, key=lambda r: (np.mean(head[r]["values"][metric]), -head[r]["m"]),
               default=None)


def primary_rows(key: str, head: Mapping[str, Any], N: int = 0) -> tuple[str, str]:
    """The two headline rows a primary key compares; for "warm" the warm start's stronger
    mode on the key's metric (`stronger_warm_start`)."""
    a, b = parse_key(key)[:2]
    if b == WARM:
        return a, stronger_warm_start(head, metric_key(key, N)) or "sft"
    return a, b


def _problem_claim(text: str, head: Mapping[str, Any], a: str, b: str, metric: str
                   ) -> dict[str, Any]:
    """`in_every_seed` on two headline rows' per-problem values of `metric` (their
    "per_problem": {metric: [seed][problem]}), matched by seed id; a row without them is a
    claim "not measured"."""
    lacking = [r for r in (a, b) if metric not in head[r].get("per_problem", {})]
    if lacking:
        c = make_claim(text, INCONCLUSIVE, [], f"not measured: no per-problem {metric} of "
                       f"{lacking[0]}", 1.0)
        c["note"] = ""
        return c
    seeds = matched_seeds(head[a]["seeds"], head[b]["seeds"], names=(a, b), text=text)
    at = {row: dict(zip(head[row]["seeds"], head[row]["per_problem"][metric], strict=True))
          for row in (a, b)}
    return in_every_seed(text, [at[a][s] for s in seeds], [at[b][s] for s in seeds], seeds,
                         names=(a, b))


def primary_claims(head: Mapping[str, Any], keys: Sequence[str], N: int
                   ) -> list[dict[str, Any]]:
    """The primary family: each key's claim on the headline (`primary_rows`, paired by seed id,
    one-sided at LEVEL), Holm-adjusted over the family; a key whose rows or metric are absent
    from the headline is a claim "not measured" (inconclusive, p 1) so the family keeps its
    pre-registered size."""
    out = []
    for key in keys:
        metric = metric_key(key, N)
        a, b = primary_rows(key, head, N)
        sa, sb = _series(head, a, metric), _series(head, b, metric)
        if per_problem(key) and sa is not None and sb is not None:
            c = _problem_claim(primary_text(key, N), head, a, b, metric)
            if b.startswith("sft") and c["n"]:
                c["evidence"] += f"; {b} is the warm start's stronger mode on {metric}"
        elif sa is None or sb is None:
            c = make_claim(primary_text(key, N), INCONCLUSIVE, [], f"not measured: the headline "
                       f"has no {metric} of {a if sa is None else b}", 1.0)
            c["note"] = ""
        else:
            c = _paired(primary_text(key, N), sa, sb, (a, b))
            if b.startswith("sft"):
                c["evidence"] += f"; {b} is the warm start's stronger mode on {metric}"
        out.append({**c, "key": key})
    return holm(out)
