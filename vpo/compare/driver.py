"""`vpo compare`: GRPO vs VPO and their baselines, from ONE warm start to test-time search.

Stages (one function each; every stage calls the library, nothing is re-implemented here; each
finished stage is read back on --resume, `vpo.compare.resume`):

  1. `warm_start`   ONE SFT policy (`vpo.rl.sft.run_sft`) on a mixture of 1-answer and m-answer
                    prompts (and search mutation prompts); every arm, whatever its m, starts
                    from it, so differences between arms come from RL.
     pilot gate     (`vpo.compare.gate`) the warm start measured before any RL; a design that
                    cannot show an effect stops here.
  2. `train_arms`   (`vpo.compare.arms`) RL per arm and seed (`vpo.run.loop.train`): same
                    steps, prompts B, samples G, optimiser; seed i of every arm trains on the
                    same problem order. Every run checkpoints `law_points` times; each
                    checkpoint is scored on held-out problems (`law_trajectory`) for the entropy
                    law.
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
                    (`vpo.compare.numbers`, `vpo.eval.claims`), report.md rendered from
                    summary.json (`vpo.compare.render`) and the PNGs (`vpo.compare.figures`).

Arms (`ARMS`): "grpo" is the paper's GRPO baseline, ONE answer per generation and the scalar
reward w*ᵀr; "maxk" Max@K (k = max(2, G/2), std-normalised as in verl; arXiv 2510.23393);
"rw_grpo" random-weight GRPO (a fresh Dirichlet weight, scalar GRPO on wᵀr); "passk" pass@k
training (Chen et al. 2025, arXiv 2508.10751); "multi_rlvr" GRPO on the m-answer prompt with
the summed scalar Σ_j w*ᵀr_j (Puri et al., arXiv 2603.24844); "vpo" VPO (arXiv 2605.22817) on
the same m answers; "clip_cov" / "kl_cov" (Cui et al., arXiv 2505.22617), "gppo"
(gradient-preserving clipping, arXiv 2508.07629) and "entropy_mask" (Wang et al., arXiv
2506.01939) single-answer GRPO with an entropy control; "grpo_mut" /
"vpo_mut" the same as grpo / vpo with `train.mutation_fraction` > 0 (mutation prompts in RL),
the remedy measured for the search stage.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import gate as compare_gate
from vpo.compare import render as compare_render
from vpo.compare import report as compare_report
from vpo.compare import search_leg, self_demos, verdicts
from vpo.compare.arms import train_arms
from vpo.compare.config import CompareConfig
from vpo.compare.resume import Stages, check_out_dir
from vpo.config import ConfigError, ModelConfig
from vpo.eval import policies as policy_eval
from vpo.io.policy_folder import load_model
from vpo.launch.rules import context_of, fit_seq_len
from vpo.launch.warm_start import assemble_sft, run_warm_start, save_warm_start
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
    # the temperature sweep: island search and best-of-N, per other temperature, for the warm
    # start (its mode is calibrated later: the larger m, the cheaper, counted) and primary arms
    extra = 2 * cfg.num_seeds * len(set(cfg.search_temperatures) - {cfg.search.temperature})
    policies += [(cfg.arm_answers(a), extra) for a in cfg.primary_arms]
    policies += [(max(cfg.all_answers), extra)] if extra else []
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
    per_problem = [verdicts.metric_key(k, cfg.eval_budget)
                   for k in verdicts.primary_keys(cfg.primary) if verdicts.per_problem(k)]
    for i, (name, seed, m, model) in enumerate(rows):
        metrics, per = policy_eval.evaluate_policy_per_problem(
            model, task, records, num_answers=m, budget=cfg.eval_budget, ks=ks,
            key=jax.random.fold_in(jax.random.key(cfg.eval_seed), seed),
            temperature=cfg.eval_temperature, per_problem=per_problem)
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
    log(compare_render.design_text(cfg))  # what the design can decide, before anything runs
    os.makedirs(os.path.join(out_dir, "stages"), exist_ok=True)
    write_json_atomic(os.path.join(out_dir, "config.json"), dataclasses.asdict(cfg))
    if cfg.model in ("tiny", "small") and not cfg.init and jax.default_backend() == "cpu":
        est = estimate_seconds(cfg, task)
        log(f"estimated wall time on 2 CPU cores (rough, from the quickstart's measured costs): "
            f"{est['total'] / 60:.0f} min (" + ", ".join(
                f"{k} {v / 60:.1f}" for k, v in est.items() if k != "total") + ")")
    stage = Stages(out_dir, resume=resume, log=log)
    wall, loads = stage.wall, [compare_report.machine_load()]
    policy = stage.kept("warm start", lambda: warm_start(cfg, task, out_dir, log, resume=resume,
                                                         progress=progress))
    gate = stage("pilot gate", lambda: compare_gate.pilot_gate(cfg, task, policy))
    failed = compare_gate.gate_failures(cfg, gate)
    log(compare_gate.gate_text(cfg, gate, failed))
    if failed and cfg.gate:
        raise compare_gate.refusal("; ".join(failed), out_dir)
    pilot: dict[str, Any] = {}

    def on_pilot(first):
        pilot.update(compare_gate.diversity_pilot(cfg, first))
        log(compare_gate.diversity_text(pilot))

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
                raise compare_gate.refusal(miss, out_dir)
    runs = stage("RL", lambda: train_arms(cfg, task, policy, out_dir, log, resume=resume,
                                          progress=progress, on_pilot=on_pilot), cached=False)
    if resume:  # the RL stage's time: every run's own, whichever session trained it
        wall["RL"] = sum(r.seconds for rs in runs.values() for r in rs)
    evals = stage("evaluation", lambda: evaluate_arms(cfg, task, policy, runs, log))
    searches = probes = temperatures = None
    if with_search:
        rows = policy_rows(cfg, policy, runs)
        searches = stage("search", lambda: search_leg.search_arms(
            cfg, task, rows, chosen, calibration, log,
            progress=lambda i, n, t0, what: _progress(log, "search", i, n, t0, what)))
        if cfg.search_temperatures:
            temperatures = stage("temperatures", lambda: search_leg.temperature_sweep(
                cfg, task, search_leg.sweep_rows(cfg, rows, calibration), chosen, calibration,
                progress=lambda i, n, t0, what: _progress(log, "temperatures", i, n, t0, what)))
        probes = stage("mutation probe", lambda: probe_arms(cfg, task, policy, runs, chosen))
    wall["total"] = sum(wall.values())
    loads.append(compare_report.machine_load())
    summary = compare_report.write_report(out_dir, cfg, command=command, wall=wall, runs=runs,
                                          evals=evals, searches=searches, probes=probes,
                                          temperatures=temperatures, load=" -> ".join(loads),
                                          gate=gate | {"failed": failed,
                                                       **({"pilot": pilot} if pilot else {})},
                                          data=compare_data.describe(cfg, task))
    log(f"report: {os.path.join(out_dir, 'report.md')} ({wall['total']:.0f} s)")
    return summary
