"""`vpo compare`: GRPO vs VPO and their baselines, from ONE warm start to test-time search.

Stages (one function each; every stage calls the library, nothing is re-implemented here):

  1. `warm_start`   ONE SFT policy (`vpo.rl.sft.run_sft`) on a mixture of 1-answer and m-answer
                    prompts (and search mutation prompts); every arm, whatever its m, starts
                    from it, so differences between arms come from RL.
  2. `train_arms`   RL per arm and seed (`vpo.run.loop.train`): same steps, prompts B, samples G,
                    optimiser; seed i of every arm trains on the same problem order. Every run
                    checkpoints `law_points` times; each checkpoint is scored on held-out
                    problems (`law_trajectory`) for the entropy law.
  3. `evaluate_arms` budget-fair evaluation at temperature `eval_temperature`
                    (`vpo.eval.policies`): N candidates per problem for every row (N/m
                    generations of m answers, or N single answers), every parsed answer scored
                    the same way; seed i of every row (warm starts included) uses the same key.
  4. search leg     (`vpo.compare.search_leg`) before RL: the search problems (the
                    `search_problems` hardest for the warm start on a split of their own, which
                    no arm is evaluated or chosen on) and the calibrated budget (the warm
                    start's island search solving `search_band_lo`-`search_band_hi` of them);
                    after RL: island search, best-of-N and revision with each row's policy
                    (`search_methods`), `search_seeds` searches per problem and training seed,
                    seed i of every row with the same keys; `probe_arms` measures each policy
                    as a mutation operator on its own (`policy_eval.mutation_probe`).
  6. report        `vpo.compare.report`: paired 95% intervals over seeds and three-way verdicts
                    (`vpo.eval.claims`).

Arms (`ARMS`): "grpo" is the paper's GRPO baseline, ONE answer per generation and the scalar
reward w*ᵀr; "maxk" Max@K (k = max(2, G/2), std-normalised as in verl; arXiv 2510.23393);
"rw_grpo" random-weight GRPO (a fresh Dirichlet weight, scalar GRPO on wᵀr); "passk" pass@k
training (Chen et al. 2025, arXiv 2508.10751); "multi_rlvr" GRPO on the m-answer prompt with
the summed scalar Σ_j w*ᵀr_j (Puri et al., arXiv 2603.24844); "vpo" VPO (arXiv 2605.22817) on
the same m answers; "clip_cov" / "kl_cov" (Cui et al., arXiv 2505.22617) and "entropy_mask"
(Wang et al., arXiv 2506.01939) single-answer GRPO with an entropy control; "grpo_mut" /
"vpo_mut" the same as grpo / vpo with `train.mutation_fraction` > 0 (mutation prompts in RL),
the remedy measured for the search stage.
"""

# size: one job, the stages of `vpo compare` (one function each) and their resume.

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from vpo.compare import data as compare_data
from vpo.compare import report as compare_report
from vpo.compare import search_leg, self_demos, verdicts
from vpo.compare.config import ARMS, CompareConfig
from vpo.config import ConfigError, ModelConfig, RunConfig, from_dict
from vpo.eval import policies as policy_eval
from vpo.io import run_checkpoint
from vpo.io.policy_folder import load_model
from vpo.launch.assemble import assemble_config, load_init
from vpo.launch.rules import context_of, fit_seq_len
from vpo.launch.warm_start import assemble_sft, run_warm_start, save_warm_start
from vpo.model import sharding
from vpo.rl.step import model_of
from vpo.run.loop import train
from vpo.run.metrics_log import JSONL
from vpo.run.run_folder import policy_complete, write_json_atomic

# Seconds per token on 2 CPU cores, tiny policy, measured on the quickstart (7x7 mazes, 8 seeds x
# GRPO / VPO) at commit 407630f, a cold compile cache, the machine loaded by other jobs: an SFT
# row-token (demonstration building included), an RL sample-token, an evaluation
# candidate-token and a search candidate-token (mutation probe included); plus the fixed cost of
# one RL run (compile, checkpoints).
_COST = {"sft": 4.0e-5, "rl": 1.8e-5, "eval": 4.8e-6, "search": 1.4e-5, "fixed_per_run": 6.0}


def estimate_seconds(cfg: CompareConfig, task) -> dict[str, float]:
    """A rough wall-time estimate per stage on 2 CPU cores for the tiny policy: tokens
    processed x the per-token costs of `_COST`; meaningless for an accelerator or a large
    model, where it is not printed."""
    recs = task.make_problems(cfg.eval_seed, 4)
    P = max(task.prompt_arrays(recs, m)[0].shape[1] for m in cfg.all_answers)
    tok = {m: P + task.completion_len(m)
           for m in {*cfg.all_answers, *map(cfg.arm_answers, cfg.arm_names)}}
    arms = [cfg.arm_answers(a) for a in cfg.arm_names]
    rl = sum(cfg.num_seeds * cfg.train.steps * cfg.train.batch_size * cfg.sampler.num_samples
             * tok[m] for m in arms)
    law = sum(cfg.num_seeds * cfg.law_points * cfg.law_problems * cfg.law_budget // m * tok[m]
              for m in arms)
    ev = sum(cfg.num_seeds * cfg.eval_problems * cfg.eval_budget // m * tok[m]
             for m in arms + cfg.all_answers)
    ev += sum(cfg.search_pool * cfg.eval_budget // m * tok[m] for m in cfg.all_answers)
    # every row and seed (the warm start's too, each seed its own keys) and the calibration
    policies = ([(m, cfg.num_seeds * len(cfg.search_method_names)) for m in arms]
                + [(m, cfg.num_seeds * len(cfg.search_method_names) + 1)
                   for m in cfg.all_answers])
    srch = sum(n * cfg.search_seeds * cfg.search_problems * cfg.search.budget // m
               * (tok[m] + P) for m, n in policies)
    out = {"warm start": 0.0 if cfg.init else _COST["sft"] * cfg.sft_steps * cfg.sft_batch
           * max(tok.values()),
           "RL": _COST["rl"] * (rl + law) + _COST["fixed_per_run"] * len(arms) * cfg.num_seeds,
           "evaluation": _COST["eval"] * ev,
           "search": _COST["search"] * srch}
    out["total"] = sum(out.values())
    return out


# -- stages -----------------------------------------------------------------------------------

@dataclasses.dataclass
class ArmRun:
    """One trained (arm, seed): its run folder, final policy, per-step training metrics and
    the entropy-law trajectory (held-out score at each checkpoint)."""

    arm: str
    seed: int
    num_answers: int
    out_dir: str
    model: Any
    metrics: list[dict[str, float]]
    law: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0  # training + entropy-law scoring


def _seq_len(cfg: CompareConfig, task, m: int) -> int:
    """Positions a policy needs (`vpo.launch.rules.fit_seq_len`): prompt + m answers and a
    search mutation prompt + m answers, measured on evaluation problems, at least the init
    checkpoint's context (`context_of`) or the model preset's length."""
    return fit_seq_len(task, m, num_parents=cfg.search.parents, seed=cfg.eval_seed,
                       num_problems=16, at_least=context_of(cfg.init) or ModelConfig.max_seq_len)


def parse_rates(cfg: CompareConfig, task, model) -> dict[int, float]:
    """{m: the share of a policy's answer slots that parse (`valid_fraction`)} on 8 held-out
    problems at the evaluation temperature, for every m of the mixture (each arm answers in its
    own m, so each format is measured on its own)."""
    records = task.make_problems(cfg.eval_seed + 2, 8)
    return {m: float(policy_eval.evaluate_policy(
        model, task, records, num_answers=m, budget=2 * m, ks=[1],
        key=jax.random.key(cfg.eval_seed + 2),
        temperature=cfg.eval_temperature)["valid_fraction"]) for m in cfg.all_answers}


def format_gaps(cfg: CompareConfig, rates: dict[int, float]) -> list[str]:
    """The arms whose answer format parses below `parse_floor`, each named with its m and rate
    ("vpo (m=2: 0% parse)"); [] when every arm's format parses."""
    return [f"{arm} (m={cfg.arm_answers(arm)}: {rates[cfg.arm_answers(arm)]:.0%} parse)"
            for arm in cfg.arm_names if rates[cfg.arm_answers(arm)] < cfg.parse_floor]


def has_demonstrations(cfg: CompareConfig, task) -> bool:
    """Whether the task can make SFT demonstrations in every m of the mixture (your data: a
    `completion` column with m answers)."""
    record = compare_data.training(task).make_problems(cfg.train.seed, 1)[0]
    try:
        for m in cfg.all_answers:
            task.task.demonstrations(record, np.random.default_rng(0), m)
    except (ValueError, RuntimeError, KeyError, TypeError):
        return False
    return True


def warm_start(cfg: CompareConfig, task, out_dir: str, log=print, resume: bool = False,
               progress: bool = False):
    """The ONE policy every arm starts from: the SFT warm start (`vpo.launch.warm_start`, as
    `vpo sft` runs it) on a mixture of 1-answer and m-answer demonstrations (a share
    `sft_mutation_fraction` of them search mutation prompts), saved to out_dir/sft. From an
    `init` policy, the SFT (LoRA adapters of `lora_rank`, folded in afterwards) runs only when
    fewer than `parse_floor` of some arm's answers parse in that arm's own m (`parse_rates`,
    `format_gaps`; on your data without demonstrations, from the model's own single answers
    joined into sets, `own_demonstrations`): a pretrained chat model first learns the answer
    format in its own chat template. `resume`: a
    complete out_dir/sft is loaded, not redone; `progress`: the SFT step bar."""
    max_len = max(_seq_len(cfg, task, m) for m in cfg.all_answers)
    path = os.path.join(out_dir, "sft")
    if resume and policy_complete(path):
        log(f"  resumed: the warm start in {path}")
        return load_model(path, max_seq_len=max_len)[0]
    init, sft_task, self_info = None, compare_data.training(task), {}
    if cfg.init:
        init = load_model(cfg.init, max_seq_len=max_len)[0]
        rates = parse_rates(cfg, task, init)
        gaps = format_gaps(cfg, rates)
        log(f"  {cfg.init}: " + ", ".join(f"{r:.0%} of its m={m} answers parse"
                                          for m, r in rates.items())
            + f" (parse_floor {cfg.parse_floor:.0%}): "
            + (f"{cfg.sft_steps} SFT steps first for {', '.join(gaps)}" if gaps
               else "no warm start SFT"))
        if not gaps or cfg.sft_steps < 1:
            return init
        if not has_demonstrations(cfg, task):
            sft_task, self_info = own_demonstrations(cfg, task, init, gaps, log)
    plan = assemble_sft(sft_task, cfg.init or cfg.model,
                        num_answers=cfg.all_answers, seed=cfg.eval_seed,
                        num_parents=cfg.search.parents, num_problems=16,
                        lora_rank=cfg.lora_rank, learning_rate=cfg.sft_lr,
                        at_least=context_of(cfg.init) or ModelConfig.max_seq_len, init=init)
    policy, losses = run_warm_start(plan, steps=cfg.sft_steps, batch_size=cfg.sft_batch,
                                    num_answers=cfg.all_answers, seed=cfg.train.seed,
                                    num_demos=cfg.sft_demos,
                                    mutation_fraction=cfg.sft_mutation_fraction,
                                    mutation_parents=cfg.search.parents, progress=progress)
    rates = parse_rates(cfg, task, policy) if cfg.init else {}
    extra = {"parse_rate": min(rates.values()), "parse_rates": rates} if rates else {}
    short = format_gaps(cfg, rates) if rates else []
    if short:  # said, not hidden: such an arm's answers mostly score nothing in RL
        log(f"  warning: after the format SFT {', '.join(short)} still parse below "
            f"parse_floor {cfg.parse_floor:.0%}; raise sft_steps (now {cfg.sft_steps})")
    extra |= {"self_demonstrations": self_info} if self_info else {}
    save_warm_start(path, plan, policy, losses, steps=cfg.sft_steps,
                    num_answers=cfg.all_answers, info={"task": cfg.task, **extra,
                                          **({"task_kwargs": cfg.task_kwargs}
                                             if cfg.task_kwargs else {})})
    log(f"  SFT m in {cfg.all_answers} at learning rate {plan.learning_rate:g}: loss "
        f"{losses[0]:.3f} -> {losses[-1]:.3f}"
        + (", " + ", ".join(f"{r:.0%} of its m={m} answers parse"
                            for m, r in extra["parse_rates"].items()) if extra else "")
        + f" ({path})")
    return policy


def own_demonstrations(cfg: CompareConfig, task, init, gaps: list[str], log=print):
    """The format warm start's task when the data has no demonstrations: `init`'s own valid
    single answers to the training rows (`self_demo_samples` each at the training
    temperature), joined into the m-answer format (`vpo.compare.self_demos`) → (the training
    task demonstrating them, a record of how many rows had m distinct valid answers). Fewer
    such rows than one SFT batch is a ConfigError naming the arms and what to change."""
    train = compare_data.training(task)
    rows = train.make_problems(cfg.train.seed, cfg.sft_demos)
    m = max(cfg.all_answers)
    demos = self_demos.self_demonstrations(
        init, train, rows, num_answers=m, samples=cfg.self_demo_samples,
        key=jax.random.key(cfg.train.seed + 7), temperature=cfg.sampler.temperature)
    info = {"rows": len(demos), "of": len(rows), "samples": cfg.self_demo_samples, "m": m}
    log(f"  no demonstrations in your data: the format SFT joins {cfg.init}'s own single "
        f"answers into sets of {m}; {len(demos)} of {len(rows)} training rows had {m} distinct "
        f"valid answers among {cfg.self_demo_samples} samples")
    if len(demos) < cfg.sft_batch:
        raise ConfigError(
            f"the arm(s) {', '.join(gaps)} cannot answer in their format before RL, your data "
            f"has no demonstrations, and {cfg.init}'s own single answers gave {m} distinct valid "
            f"answers on only {len(demos)} of {len(rows)} training rows (fewer than one SFT "
            f"batch, sft_batch={cfg.sft_batch}): give the rows a `completion` column (a list "
            f"of m answer texts), raise self_demo_samples, lower num_answers, or drop those "
            "arms (arms=...)")
    return self_demos.with_demonstrations(train, demos), info


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
    scores_PG = np.asarray(pool.scores_PN, float)
    spread = float(np.mean(scores_PG.max(-1) - scores_PG.min(-1) > 1e-6))
    # per weighted component, the share of scored candidates at full marks (what "solved" needs
    # of each, on a task whose solved is every weighted component at 1)
    rewards = np.asarray(pool.rewards_PNR, float)[np.asarray(pool.valid_PN, bool)]
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
        r_PGR = np.asarray(pool.rewards_PNR, float)
        hit_PGC = r_PGR[..., list(cover)] >= 1.0 - 1e-6
        out["hit_rates"] = {task.reward_names[c]: float(hit_PGC[..., i].mean())
                            for i, c in enumerate(cover)}
        out["hit_groups"] = float(np.mean(hit_PGC.any(-1).any(-1)))
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


def _copy(model):
    """The same policy on fresh buffers (the trainer donates its state; the warm start is
    shared by several runs)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jax.numpy.copy, state))


def arm_changes(cfg: CompareConfig, task, arm: str, seed: int, max_seq_len: int
                ) -> dict[str, Any]:
    """The typed changes of one arm and seed to `RunConfig`'s defaults, {"section.key": value}:
    the task, every shared train / sampler / objective field that differs from the default (the
    learning rate always: the comparison sets it), then the arm's own changes (`ARMS`), its
    seed, m, mutation parents, answer budget `task.completion_len(m)` and the warm start's
    `max_seq_len`; with `law_points` the run checkpoints that many times (and keeps them all)."""
    spec, m = ARMS[arm], cfg.arm_answers(arm)
    train = {**dataclasses.asdict(cfg.train), **spec.train, "seed": seed, "num_answers": m,
             "mutation_parents": cfg.search.parents}
    if cfg.law_points:
        train |= {"checkpoint_every": cfg.train.steps // cfg.law_points,
                  "keep_checkpoints": cfg.law_points + 1}
    sections = {"train": train,
                "sampler": {**dataclasses.asdict(cfg.sampler),
                            "max_new_tokens": task.completion_len(m)},
                "objective": {**dataclasses.asdict(cfg.objective), **spec.objective}}
    default = RunConfig()
    out: dict[str, Any] = {"task": cfg.task, **compare_data.run_changes(cfg),
                           "model.max_seq_len": max_seq_len}
    if cfg.lora_rank:
        out["model.lora_rank"] = cfg.lora_rank
    always = ("sampler.max_new_tokens", "train.learning_rate")
    for section, fields in sections.items():
        base = dataclasses.asdict(getattr(default, section))
        out |= {f"{section}.{key}": value for key, value in fields.items()
                if value != base[key] or f"{section}.{key}" in always}
    mesh = -1 if cfg.devices == -1 else cfg.devices
    return out | ({"mesh_data": mesh} if mesh != default.mesh_data else {})


def arm_overrides(changes: dict[str, Any]) -> list[str]:
    """`arm_changes` as the arguments of the equivalent `vpo train` command: `section.key=value`
    strings (a dict value as JSON), after the --data flags of a run on your data
    (`compare_data.flags`)."""
    data = changes.get("task_kwargs") if changes.get("task") == "dataset" else None
    return ((compare_data.flags(data) if data else [])
            + [f"{key}={json.dumps(value) if isinstance(value, dict) else value}"
               for key, value in changes.items()
               if not (data and key in ("task", "task_kwargs"))])


def _with_changes(run: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """`run` with typed {"section.key": value} changes (a top-level field has no section)."""
    top = {k: v for k, v in changes.items() if "." not in k}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        if "." in key:
            section, field = key.split(".", 1)
            sections.setdefault(section, {})[field] = value
    return dataclasses.replace(run, **top, **{
        section: dataclasses.replace(getattr(run, section), **fields)
        for section, fields in sections.items()})


def arm_run_config(cfg: CompareConfig, task, arm: str, seed: int, init_spec: str,
                   policy) -> tuple[RunConfig, list[str]]:
    """(RunConfig, overrides) of one arm and seed: the run `vpo train --init init_spec
    <overrides>` starts, assembled from typed changes by `vpo.launch.assemble.assemble_config`
    with the task the comparison assembled once, and `load_init` on the warm start `policy`
    already in memory (its config, with the run's LoRA settings and sequence length)."""
    changes = arm_changes(cfg, task, arm, seed, policy.cfg.max_seq_len)
    plan = assemble_config(_with_changes(RunConfig(), changes), frozenset(changes),
                           init_spec=init_spec, task=task)
    _, run, _ = load_init(plan, policy=policy)
    return run, arm_overrides(changes)


def train_command(init_spec: str, path: str, overrides: list[str]) -> str:
    """The `vpo train` command line that trains the same run as an arm of `vpo compare`."""
    return shlex.join(["vpo", "train", "--init", init_spec, "--out", path, *overrides])


def _law_score(cfg: CompareConfig, task, model, m: int) -> float:
    """Held-out evaluation score (mean w*ᵀr per candidate, i.e. best@1) on the law problems at
    the evaluation temperature, with the same key for every policy and checkpoint."""
    records = task.make_problems(cfg.eval_seed + 1, cfg.law_problems)
    return policy_eval.evaluate_policy(
        model, task, records, num_answers=m, budget=cfg.law_budget, ks=[1],
        key=jax.random.key(cfg.eval_seed + 1), temperature=cfg.eval_temperature)["best@1"]


def law_trajectory(cfg: CompareConfig, task, path: str, graphdef, state, metrics,
                   start_score: float, m: int) -> dict[str, list[float]]:
    """(step, H, R) at step 0 and every checkpoint of a run: H = mean token entropy of the
    training rollouts of the last (up to) 10 steps before it (step 0: the first step's, drawn
    from the warm start), R = `_law_score` of the checkpoint's policy."""
    mngr = run_checkpoint.CheckpointManager(os.path.join(path, "checkpoints"),
                                            keep=cfg.law_points + 1)
    H = np.array([r["entropy"] for r in metrics], float)
    out = {"step": [0], "entropy": [float(H[0])], "score": [start_score]}
    try:
        for s in mngr.all_steps():
            restored, _ = mngr.restore(state, step=s)
            out["step"].append(s)
            out["entropy"].append(float(H[max(0, s - 10):s].mean()))
            out["score"].append(_law_score(cfg, task, model_of(graphdef, restored), m))
    finally:
        mngr.close()
    return out


def _read_arm_run(path: str, arm: str, seed: int, m: int, max_len: int) -> ArmRun | None:
    """A finished (arm, seed) of an earlier, interrupted `vpo compare`: its `ARM_DONE` record
    (entropy-law trajectory, seconds), metrics and exported policy; None if it did not finish."""
    done = os.path.join(path, ARM_DONE)
    if not os.path.exists(done):
        return None
    with open(done) as f:
        record = json.load(f)
    with open(os.path.join(path, JSONL)) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    model = load_model(os.path.join(path, "policy"), max_seq_len=max_len)[0]
    return ArmRun(arm, seed, m, path, model, rows, record["law"], record["seconds"])


ARM_DONE = "compare_run.json"  # written last in an (arm, seed) folder: the run is complete


def train_arms(cfg: CompareConfig, task, policy, out_dir: str, log=print,
               resume: bool = False, progress: bool = False,
               on_pilot=None) -> dict[str, list[ArmRun]]:
    """RL for every arm and seed from the warm start → {arm: [ArmRun per seed]}, seed by seed:
    once the first seed of every arm has trained, `on_pilot(runs)` sees those runs (the
    diversity pilot, `diversity_pilot`) before the other seeds start.

    `resume`: finished runs of an interrupted comparison are read back (`_read_arm_run`); an
    unfinished one continues from its last checkpoint (`loop.train(resume=True)`, which
    continues exactly as the uninterrupted run would), or is redone if it had finished
    training but not its entropy-law scores."""
    devices = jax.devices() if cfg.devices == -1 else jax.devices()[:cfg.devices]
    mesh = sharding.make_mesh(devices=devices)
    runs: dict[str, list[ArmRun]] = {}
    start_scores: dict[int, float] = {}
    sft = os.path.join(out_dir, "sft")  # the warm start, or the init policy when it parsed
    init_spec = os.path.abspath(sft) if policy_complete(sft) else cfg.init
    total, done, t_all = len(cfg.arm_names) * cfg.num_seeds, 0, time.perf_counter()
    train_task = compare_data.training(task)  # RL rows: your data's training part
    programs: dict = {}  # each arm's step compiled once, reused by its other seeds
    for arm in cfg.arm_names:
        m = cfg.arm_answers(arm)
        if cfg.law_points and m not in start_scores:
            start_scores[m] = _law_score(cfg, task, policy, m)
    for i, seed in enumerate(cfg.seeds):  # seed by seed: the first seed of every arm is a pilot
        for arm in cfg.arm_names:
            m = cfg.arm_answers(arm)
            path = os.path.join(out_dir, "arms", arm, f"seed{seed}")
            run, overrides = arm_run_config(cfg, train_task, arm, seed, init_spec, policy)
            earlier = (_read_arm_run(path, arm, seed, m, policy.cfg.max_seq_len)
                       if resume else None)
            if earlier is not None:
                runs.setdefault(arm, []).append(earlier)
                total -= 1
                log(f"  {arm} seed {seed}: resumed (finished earlier, {earlier.seconds:.0f} s)")
                continue
            if resume and policy_complete(os.path.join(path, "policy")):
                shutil.rmtree(path)  # trained, but killed before its law scores: redo it
            elif not resume and os.path.exists(path):
                shutil.rmtree(path)
            t0 = time.perf_counter()
            graphdef, state = train(run, path, resume=resume, task=train_task, mesh=mesh,
                                    progress=progress, init=_copy(policy),
                                    bar_label=f"{arm} seed {seed}", programs=programs)
            with open(os.path.join(path, JSONL)) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            law = (law_trajectory(cfg, task, path, graphdef, state, rows, start_scores[m], m)
                   if cfg.law_points else {})
            seconds = time.perf_counter() - t0
            write_json_atomic(os.path.join(path, ARM_DONE), {
                "law": law, "seconds": seconds,
                "command": train_command(init_spec, path, overrides)})
            runs.setdefault(arm, []).append(ArmRun(arm, seed, m, path, model_of(graphdef, state),
                                                   rows, law, seconds))
            done += 1
            left = (time.perf_counter() - t_all) / done * (total - done)
            log(f"  {arm} seed {seed}: {len(rows)} steps, reward {rows[0]['reward']:.3f} -> "
                f"{rows[-1]['reward']:.3f}, entropy {rows[0]['entropy']:.3f} -> "
                f"{rows[-1]['entropy']:.3f} ({time.perf_counter() - t0:.0f} s; run {done} of "
                f"{total}, ~{left / 60:.1f} min of RL left)")
        if i == 0 and on_pilot is not None:
            on_pilot(runs)
    return runs


def diversity_pilot(cfg: CompareConfig, runs: dict[str, list[ArmRun]]) -> dict[str, Any]:
    """The first seed of every arm as a pilot: each arm's mean training diversity (the step
    metric `diversity`, mean pairwise L1 distance of the valid answers' reward vectors in a
    group) over its first fifth of the steps, and for each primary claim A-B between two
    arms whether A's is above B's. A design whose VPO arm trains no more diversely than GRPO
    in its pilot is unlikely to show the set-level gain its claims test; the numbers go to the
    report (a statement about one seed, not a test)."""
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


def _progress(log, stage: str, done: int, total: int, t0: float, what: str) -> None:
    """A stage's per-item line: what finished, how many of how many, the estimate left."""
    spent = time.perf_counter() - t0
    log(f"  {stage}: {what} ({done} of {total}, {spent:.0f} s; ~"
        f"{spent / done * (total - done) / 60:.1f} min left)")


def policy_rows(cfg: CompareConfig, policy, runs) -> list[tuple[str, int, int, Any]]:
    """(row name, seed, m, model): the warm start in every m of the mixture (once per seed, so
    its rows pair with the arms' seeds) and every trained arm and seed."""
    rows = [(f"sft (m={m})", seed, m, policy) for m in cfg.all_answers for seed in cfg.seeds]
    for arm, seed_runs in runs.items():
        rows += [(arm, r.seed, r.num_answers, r.model) for r in seed_runs]
    return rows


def evaluate_arms(cfg: CompareConfig, task, policy, runs, log=print) -> dict[str, Any]:
    """Budget-fair evaluation on cfg.eval_problems held-out problems: per row and seed the
    metrics of `evaluation.summarize_pool` + entropy, and per-problem best score / solved.
    Seed s of every row is evaluated with the key fold_in(key(eval_seed), s)."""
    records = task.make_problems(cfg.eval_seed, cfg.eval_problems)
    ks = cfg.eval_ks
    out: dict[str, Any] = {"ks": ks, "temperature": cfg.eval_temperature, "rows": {}}
    rows, t0 = policy_rows(cfg, policy, runs), time.perf_counter()
    for i, (name, seed, m, model) in enumerate(rows):
        metrics, per = policy_eval.evaluate_policy_per_problem(
            model, task, records, num_answers=m, budget=cfg.eval_budget, ks=ks,
            key=jax.random.fold_in(jax.random.key(cfg.eval_seed), seed),
            temperature=cfg.eval_temperature)
        out["rows"].setdefault(name, []).append(
            {"seed": seed, "m": m, **metrics, **{k: v.tolist() for k, v in per.items()}})
        _progress(log, "evaluation", i + 1, len(rows), t0, f"{name} seed {seed}")
    return out


def probe_arms(cfg: CompareConfig, task, policy, runs, chosen: dict[str, Any]
               ) -> dict[str, list[dict[str, float]]]:
    """`policy_eval.mutation_probe` for every row and seed on the search's hard problems (the
    task's weaker parents of good answers in the mutation prompt), the same prompts and key for
    all; {} for tasks without mutation demonstrations."""
    if not task.has_mutation_demonstrations:  # host-scored tasks have none
        return {}
    records = search_leg.search_records(cfg, task, chosen)
    inputs = {m: policy_eval.mutation_probe_inputs(task, records, num_answers=m,
                                                   num_parents=cfg.search.parents,
                                                   seed=cfg.search_split_seed)
              for m in cfg.all_answers}
    out: dict[str, list[dict[str, float]]] = {}
    seen: dict[tuple[int, int], dict[str, float]] = {}
    for name, seed, m, model in policy_rows(cfg, policy, runs):
        if (id(model), m) not in seen:  # the warm start's rows share one policy and key
            seen[id(model), m] = policy_eval.mutation_probe(
                model, task, inputs[m], num_answers=m, temperature=cfg.search.temperature,
                key=jax.random.key(cfg.search_split_seed + 3), samples=cfg.probe_samples)
        out.setdefault(name, []).append({"seed": seed, **seen[id(model), m]})
    return out


def _plain(x):
    """numpy scalars and arrays as JSON values."""
    return x.tolist() if hasattr(x, "tolist") else str(x)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


# What `run_compare` writes in its folder, so --overwrite removes exactly that.
OUTPUTS = ("config.json", "sft", "arms", "stages", "report.md", "summary.json")


def check_out_dir(cfg: CompareConfig, out_dir: str, *, resume: bool, overwrite: bool) -> None:
    """A comparison folder is never silently replaced: an existing one needs `resume` (same
    config, finished stages and runs are read back) or `overwrite` (its outputs removed)."""
    path = os.path.join(out_dir, "config.json")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite: choose one")
    if resume:
        if not os.path.exists(path):
            raise ConfigError(f"--resume: {out_dir} holds no comparison (no config.json); run "
                              "without --resume to start one there")
        # Settings added to vpo after the comparison started hold their defaults there.
        recorded = _read_json(path)
        with contextlib.suppress(ConfigError, TypeError):  # a removed setting: named below
            recorded = dataclasses.asdict(from_dict(CompareConfig, recorded))
        old, new = (json.loads(json.dumps(c)) for c in (recorded, dataclasses.asdict(cfg)))
        diff = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
        if diff:
            raise ConfigError(f"--resume: the comparison in {out_dir} was started with other "
                              f"settings ({', '.join(diff)} differ); resume it with the same "
                              "--preset and overrides, or start a new one in another --out")
    elif os.path.exists(path):
        if not overwrite:
            raise ConfigError(f"--out: {out_dir} already holds a comparison; continue it with "
                              "--resume, pick a new folder, or pass --overwrite to replace it")
        for name in OUTPUTS:
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            elif os.path.exists(target):
                os.remove(target)


def run_compare(cfg: CompareConfig, out_dir: str, *, command: str = "vpo compare",
                log=print, with_search: bool = True, resume: bool = False,
                overwrite: bool = False, progress: bool = False) -> dict[str, Any]:
    """All stages; writes out_dir/report.md and friends and returns the summary.

    Each finished stage is kept in out_dir/stages/<stage>.json (its result and seconds) and
    each finished RL run in its folder, so `resume=True` continues an interrupted comparison
    where it stopped with the same results (the stages are seeded); the report's stage times
    add up the time spent in every attempt. `log` gets a line per finished run, evaluated row
    and searched row with the estimate left; `progress`: the warm start's SFT bar and each RL
    run's step bar on stderr."""
    with_search = with_search and cfg.search_leg
    # bound to the policy's tokenizer; your data: its evaluation rows, with the others beside
    task = compare_data.load_tasks(cfg, with_search=with_search)  # before the folder is made
    check_out_dir(cfg, out_dir, resume=resume, overwrite=overwrite)
    log(compare_report.design_text(cfg))  # what the design can decide, before anything runs
    os.makedirs(os.path.join(out_dir, "stages"), exist_ok=True)
    write_json_atomic(os.path.join(out_dir, "config.json"), dataclasses.asdict(cfg))
    if cfg.model in ("tiny", "small") and not cfg.init and jax.default_backend() == "cpu":
        est = estimate_seconds(cfg, task)
        log(f"estimated wall time on 2 CPU cores (rough, from the quickstart's measured costs): "
            f"{est['total'] / 60:.0f} min (" + ", ".join(
                f"{k} {v / 60:.1f}" for k, v in est.items() if k != "total") + ")")
    wall: dict[str, float] = {}
    loads = [compare_report.machine_load()]

    def stage(name, fn, cached: bool = True):
        """Run a stage, or read it back when resuming; `cached=False`: the stage keeps its own
        progress (warm start, RL) and reports its time through `fn`'s return."""
        path = os.path.join(out_dir, "stages", name.replace(" ", "_") + ".json")
        if resume and cached and os.path.exists(path):
            record = _read_json(path)
            wall[name] = record["seconds"]
            log(f"[{name}] resumed ({wall[name]:.1f} s earlier)")
            return record["result"]
        log(f"[{name}]")
        t0 = time.perf_counter()
        result = fn()
        wall[name] = time.perf_counter() - t0
        if cached:  # read back as a resumed run would, so both give the same report
            result = json.loads(json.dumps(result, default=_plain))
            write_json_atomic(path, {"result": result, "seconds": wall[name]})
        log(f"[{name}] {wall[name]:.1f} s")
        return result

    def warm():
        t0, sft = time.perf_counter(), os.path.join(out_dir, "stages", "warm_start.json")
        before = _read_json(sft)["seconds"] if resume and os.path.exists(sft) else 0.0
        model = warm_start(cfg, task, out_dir, log, resume=resume, progress=progress)
        if not before:
            write_json_atomic(sft, {"seconds": time.perf_counter() - t0})
        return model, before

    (policy, before) = stage("warm start", warm, cached=False)
    wall["warm start"] += before
    gate = stage("pilot gate", lambda: pilot_gate(cfg, task, policy))
    failed = gate_failures(cfg, gate)
    log(f"pilot gate: warm start pass@1 {gate['pass@1']:.3f}, pass@{cfg.eval_budget} "
        f"{gate[f'pass@{cfg.eval_budget}']:.3f} on {gate['problems']} held-out problems; "
        f"{gate['group_spread']:.0%} of step-0 groups with unequal rewards"
        + _cover_signal_text(cfg, gate)
        + ("" if not failed else (" -- " + "; ".join(failed))))
    if failed and cfg.gate:
        raise GateError("pilot gate: the design cannot show an effect: " + "; ".join(failed)
                        + f". The numbers are in {os.path.join(out_dir, 'stages')}; fix the "
                        "design, or pass gate=false to run anyway")
    pilot: dict[str, Any] = {}

    def on_pilot(first):
        pilot.update(diversity_pilot(cfg, first))
        div = ", ".join(f"{a} {v:.3f}" for a, v in pilot["diversity"].items())
        below = [k for k, ok in pilot["above"].items() if not ok]
        log(f"diversity pilot (seed {pilot['seed']}, first {pilot['steps']} steps): training "
            f"diversity {div}" + (f" -- not above in {', '.join(below)}: the set-level claims "
                                  "may not show" if below else ""))

    chosen = calibration = None
    if with_search:  # the search leg's problems and budget, before any RL
        chosen = stage("hard problems", lambda: search_leg.hard_problems(cfg, task, policy))
        calibration = stage("search calibration",
                            lambda: search_leg.calibrate(cfg, task, policy, chosen))
        miss = search_leg.calibration_failure(cfg, calibration)
        log(f"search calibration: the warm start (m={calibration['mode']}) solves "
            f"{calibration['fraction']:.0%} of {calibration['problems']} problems at "
            f"{calibration['budget']} candidates (of "
            + ", ".join(f"{f:.0%}" for f in calibration["fractions"][str(calibration["mode"])])
            + f" at {calibration['evaluated']})" + (f" -- {miss}" if miss else ""))
        gate["search"] = {k: calibration[k] for k in ("mode", "budget", "fraction", "in_band",
                                                      "band", "problems", "searches")}
        if miss:
            failed.append(miss)
            if cfg.gate:
                raise GateError(f"pilot gate: the design cannot show an effect: {miss}. The "
                                f"numbers are in {os.path.join(out_dir, 'stages')}; fix the "
                                "design, or pass gate=false to run anyway")
    runs = stage("RL", lambda: train_arms(cfg, task, policy, out_dir, log, resume=resume,
                                          progress=progress, on_pilot=on_pilot), cached=False)
    if resume:  # the RL stage's time: every run's own, whichever session trained it
        wall["RL"] = sum(r.seconds for rs in runs.values() for r in rs)
    evals = stage("evaluation", lambda: evaluate_arms(cfg, task, policy, runs, log))
    searches = probes = None
    if with_search:
        rows = policy_rows(cfg, policy, runs)
        searches = stage("search", lambda: search_leg.search_arms(
            cfg, task, rows, chosen, calibration, log,
            progress=lambda i, n, t0, what: _progress(log, "search", i, n, t0, what)))
        probes = stage("mutation probe", lambda: probe_arms(cfg, task, policy, runs, chosen))
    wall["total"] = sum(wall.values())
    loads.append(compare_report.machine_load())
    summary = compare_report.write_report(out_dir, cfg, command=command, wall=wall, runs=runs,
                                          evals=evals, searches=searches, probes=probes,
                                          load=" -> ".join(loads),
                                          gate=gate | {"failed": failed,
                                                       **({"pilot": pilot} if pilot else {})},
                                          data=compare_data.describe(cfg, task))
    log(f"report: {os.path.join(out_dir, 'report.md')} ({wall['total']:.0f} s)")
    return summary
