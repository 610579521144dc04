"""The pilot gate of `vpo compare`: the warm start measured before any RL, as the design needs
it (`pilot_gate`: headroom at pass@k, problems it solves, step-0 groups with unequal rewards and,
on a cover task, each component's hits), what those numbers say the design cannot show
(`gate_failures`, one sentence per failed check with the setting that fixes it), the line the
comparison prints (`gate_text`) and its refusal when the gate is enforced (`refusal`, a
`GateError`); and the diversity pilot on the first seed of every arm (`diversity_pilot`,
`diversity_text`)."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import verdicts
from vpo.compare.config import CompareConfig
from vpo.config import ConfigError
from vpo.eval import policies as policy_eval


class GateError(ConfigError):
    """The pilot gate found that the comparison's design cannot show an effect."""


def pilot_gate(cfg: CompareConfig, task, policy) -> dict[str, Any]:
    """The warm start before any RL, as the design needs it: pass@1 and pass@N (N =
    `eval_budget`) on `gate_problems` held-out problems (split `eval_seed`, their own key) at
    the evaluation temperature, and the share of step-0 groups (G = `sampler.num_samples`
    samples of as many training prompts at the training temperature) whose w*ᵀr are not all
    equal: where they are all equal, group-normalised advantages are 0 and the step learns
    nothing. Returns the numbers and, per check, whether it passed."""
    N, G = cfg.eval_budget, cfg.sampler.num_samples
    kp, kc = cfg.claim_k("pass"), cfg.claim_k("cover")
    records = task.make_problems(cfg.eval_seed, cfg.gate_problems)
    ev = policy_eval.evaluate_policy(
        policy, task, records, num_answers=1, budget=N, ks=sorted({1, kp, kc, N}),
        key=jax.random.key(cfg.eval_seed + 5), temperature=cfg.eval_temperature)
    train_records = compare_data.training(task).make_problems(  # your data: its training rows
        cfg.train.seed, cfg.gate_problems)
    pool = policy_eval.sample_pool(policy, task, train_records, num_answers=1, budget=G,
                                   key=jax.random.key(cfg.train.seed + 5),
                                   temperature=cfg.sampler.temperature,
                                   top_p=cfg.sampler.top_p)[0]
    scores_BG = np.asarray(pool.scores_BN, float)
    spread = float(np.mean(scores_BG.max(-1) - scores_BG.min(-1) > 1e-6))
    # per weighted component, the share of scored candidates at full marks (what "solved" needs
    # of each, on a task whose solved is every weighted component at 1)
    rewards = np.asarray(pool.rewards_BNR, float)[np.asarray(pool.valid_BN, bool)]
    full = {name: float(np.mean(rewards[:, r] >= 1.0 - 1e-6)) if rewards.size else 0.0
            for r, name in enumerate(task.reward_names) if task.eval_weights_R[r] > 0}
    out = {"problems": cfg.gate_problems, "pass@1": ev["pass@1"], f"pass@{N}": ev[f"pass@{N}"],
           f"pass@{kp}": ev[f"pass@{kp}"], "best@1": ev["best@1"], f"best@{N}": ev[f"best@{N}"],
           "group_spread": spread, "G": G, "enforced": cfg.gate, "full_marks": full,
           "k": {"pass": kp, "cover": kc}}
    out["checks"] = {
        "headroom": ev[f"pass@{kp}"] <= cfg.gate_pass_max,
        "solves": ev[f"pass@{kp}"] >= cfg.gate_pass_min,
        "signal": spread >= cfg.spread_min}
    cover = task.task.cover_components
    if cover:  # the signal a cover claim needs: hits of each component, not format spread
        r_BGR = np.asarray(pool.rewards_BNR, float)
        hit_BGR = r_BGR[..., list(cover)] >= 1.0 - 1e-6
        out["hit_rates"] = {task.reward_names[c]: float(hit_BGR[..., i].mean())
                            for i, c in enumerate(cover)}
        out["hit_groups"] = float(np.mean(hit_BGR.any(-1).any(-1)))
        out[f"cover@{kc}"] = ev.get(f"cover@{kc}", 0.0)
        out["checks"] |= {
            "hits": min(out["hit_rates"].values()) >= cfg.gate_hit_min,
            "hit_groups": out["hit_groups"] >= cfg.gate_hit_groups_min,
            "cover": cfg.gate_cover_min <= out[f"cover@{kc}"] <= cfg.gate_cover_max}
    return out


def gate_failures(cfg: CompareConfig, gate: dict[str, Any]) -> list[str]:
    """What the pilot gate's numbers say the design cannot show, one sentence per failed check
    with the setting that fixes it; [] when every check passed."""
    k = gate.get("k", {})  # a gate recorded before claims named their k: at the budget
    N, kc = k.get("pass", cfg.eval_budget), k.get("cover", cfg.eval_budget)
    p, s = gate[f"pass@{N}"], gate["group_spread"]
    why = {"headroom": f"the warm start's pass@{N} is {p:.3f} (> gate_pass_max "
                       f"{cfg.gate_pass_max:g}): no headroom for RL to show a gain at pass@{N}; "
                       "use harder problems or a warm start that covers fewer modes",
           "solves": f"the warm start's pass@{N} is {p:.3f} (< gate_pass_min "
                     f"{cfg.gate_pass_min:g}): it solves almost nothing, so RL has no solution "
                     "to reinforce; " + (_never_full(gate) or "train the warm start longer or "
                                         "use easier problems"),
           "signal": f"only {s:.0%} of the step-0 groups of G={gate['G']} have unequal rewards "
                     f"(< gate_spread_min {cfg.spread_min:g}): most steps would learn "
                     "nothing; raise sampler.num_samples or sampler.temperature"}
    if "hit_rates" in gate:
        rates = ", ".join(f"{k} {v:.3f}" for k, v in gate["hit_rates"].items())
        cov = gate[f"cover@{kc}"]
        why |= {
            "hits": f"the warm start's step-0 hit rates are {rates} (< gate_hit_min "
                    f"{cfg.gate_hit_min:g} for some component): a set rarely covers them all, so "
                    "the cover claims' signal would not fire; train the warm start longer or "
                    "use easier targets",
            "hit_groups": f"only {gate['hit_groups']:.0%} of the step-0 groups hold a hit (< "
                          f"gate_hit_groups_min {cfg.gate_hit_groups_min:g}): reward spread there "
                          "is format, not hits",
            "cover": f"the warm start's cover@{kc} is {cov:.3f}, outside [gate_cover_min "
                     f"{cfg.gate_cover_min:g}, gate_cover_max {cfg.gate_cover_max:g}]: "
                     + ("no headroom for a cover claim" if cov > cfg.gate_cover_max else
                        f"it almost never covers, so cover@{kc} cannot move")}
    return [why[k] for k, ok in gate["checks"].items() if not ok]


def gate_text(cfg: CompareConfig, gate: dict[str, Any], failed: list[str]) -> str:
    """The pilot gate's line: the warm start's pass@1 and pass@N, the share of step-0 groups
    with unequal rewards, a cover task's hits, and what failed."""
    return (f"pilot gate: warm start pass@1 {gate['pass@1']:.3f}, pass@{cfg.eval_budget} "
            f"{gate[f'pass@{cfg.eval_budget}']:.3f} on {gate['problems']} held-out problems; "
            f"{gate['group_spread']:.0%} of step-0 groups with unequal rewards"
            + _cover_signal_text(cfg, gate)
            + ("" if not failed else (" -- " + "; ".join(failed))))


def refusal(reason: str, out_dir: str) -> GateError:
    """The enforced gate's error: what the design cannot show, where its numbers are, and
    how to run anyway."""
    return GateError(f"pilot gate: the design cannot show an effect: {reason}. The numbers are "
                     f"in {os.path.join(out_dir, 'stages')}; fix the design, or pass gate=false "
                     "to run anyway")


def _cover_signal_text(cfg: CompareConfig, gate: dict[str, Any]) -> str:
    """"; hit rates ..., cover@k ..." of a gate on a cover task ("" otherwise)."""
    if "hit_rates" not in gate:
        return ""
    kc = gate.get("k", {}).get("cover", cfg.eval_budget)
    return ("; hit rates " + ", ".join(f"{k} {v:.3f}" for k, v in gate["hit_rates"].items())
            + f", cover@{kc} {gate[f'cover@{kc}']:.3f}")


def _never_full(gate: dict[str, Any]) -> str:
    """The gate's advice when some weighted reward component never reaches full marks in the
    warm start's step-0 candidates ("" when each does, or the gate predates the count): a task
    whose "solved" needs every weighted component at 1 then solves nothing by construction."""
    never = [name for name, frac in (gate.get("full_marks") or {}).items() if frac == 0.0]
    if not never:
        return ""
    return (f"the component(s) {', '.join(never)} never reach full marks (1.0) in any of its "
            f"{gate['G']} candidates per training prompt, and solved needs every weighted "
            "component at 1: say which components define solved (--solved NAMES on your data), "
            "or make those components reachable")


def diversity_pilot(cfg: CompareConfig, runs: dict[str, list]) -> dict[str, Any]:
    """The first seed of every arm as a pilot (`runs`: {arm: [`vpo.compare.arms.ArmRun`]}):
    each arm's mean training diversity (the step metric `diversity`, mean pairwise L1 distance
    of the valid answers' reward vectors in a group) over its first fifth of the steps, and for
    each primary claim A-B between two arms whether A's is above B's. A design whose VPO arm
    trains no more diversely than GRPO in its pilot is unlikely to show the set-level gain its
    claims test; the numbers go to the report (a statement about one seed, not a test)."""
    steps = max(1, cfg.train.steps // 5)
    mean = {}
    for arm, arm_runs in runs.items():
        values = [r["diversity"] for r in arm_runs[0].metrics[:steps] if "diversity" in r]
        if values:
            mean[arm] = float(np.mean(values))
    pairs = {}
    for key in verdicts.primary_keys(cfg.primary):
        a, b = key.partition(":")[0].split("-")
        if a in mean and b in mean:
            pairs[f"{a}-{b}"] = mean[a] > mean[b]
    return {"steps": steps, "seed": cfg.seeds[0], "diversity": mean, "above": pairs}


def diversity_text(pilot: dict[str, Any]) -> str:
    """The diversity pilot's line: each arm's training diversity, and the primary pairs whose
    first arm is not above the second."""
    div = ", ".join(f"{a} {v:.3f}" for a, v in pilot["diversity"].items())
    below = [k for k, ok in pilot["above"].items() if not ok]
    return (f"diversity pilot (seed {pilot['seed']}, first {pilot['steps']} steps): training "
            f"diversity {div}" + (f" -- not above in {', '.join(below)}: the set-level claims "
                                  "may not show" if below else ""))
