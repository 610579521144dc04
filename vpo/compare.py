"""`vpo compare`: GRPO vs VPO side by side, from one warm start to test-time search.

Stages (one function each; every stage calls the library, nothing is re-implemented here):

  1. `warm_start`  SFT on the task's demonstrations (`vpo.sft.run_sft`), one policy per answer
                   count m used by the arms; every arm with that m starts from the same params.
  2. `train_arms`  RL per arm and seed (`vpo.loop.train`): same steps, prompts B, samples G,
                   optimiser and seeds; arms differ only in the advantage / loss control and m.
  3. `evaluate_arms` budget-fair evaluation (`vpo.policy_eval.sample_pool`): N candidates per
                   problem for every arm (N/m generations of m answers, or N single answers).
  4. `search_arms` island search (`vpo.search.run_method`) with each arm's policy as mutation
                   operator on the problems the warm start found hardest, equal budget.
  5. `write_report` report.md (headline table with mean and a 95% Student-t interval over
                   seeds, PNGs, commands, wall time per stage, reproduced / not reproduced).

Arms (`ARMS`): "grpo" is the paper's GRPO baseline, ONE answer per generation (m = 1) and the
scalar reward w*ᵀr; "multi_rlvr" is GRPO on the m-answer prompt with the summed scalar
Σ_j w*ᵀr_j (Puri et al., arXiv 2603.24844); "vpo" is VPO (arXiv 2605.22817) on the same m
answers;
"clip_cov" / "kl_cov" (Cui et al., arXiv 2505.22617) and "entropy_mask" (Wang et al., arXiv
2506.01939, top-20% entropy tokens) are single-answer GRPO with an entropy control.
The entropy law R = -a·exp(H) + b (Cui et al.) is fitted by `vpo.entropy_law`; the report is
written by `vpo.compare_report`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from vpo import checkpoint, compare_report, entropy_law, policy_eval, search, sharding
from vpo.checkpoint import load_model
from vpo.config import ConfigError, SamplerConfig, apply_overrides, model_preset
from vpo.loop import train
from vpo.metrics_log import JSONL
from vpo.search import SearchConfig
from vpo.sft import run_sft
from vpo.tasks.bound import seq_len_for
from vpo.train import model_of
from vpo.train_config import ObjectiveConfig, RunConfig, TrainConfig

# Arm name -> (ObjectiveConfig field overrides, answers per generation; None = the run's m).
ARMS: dict[str, tuple[dict[str, Any], int | None]] = {
    "grpo": ({"advantage": "grpo"}, 1),
    "multi_rlvr": ({"advantage": "grpo"}, None),
    "vpo": ({"advantage": "vpo"}, None),
    "clip_cov": ({"advantage": "grpo", "cov_control": "clip_cov"}, 1),
    "kl_cov": ({"advantage": "grpo", "cov_control": "kl_cov"}, 1),
    "entropy_mask": ({"advantage": "grpo", "entropy_top_frac": 0.2}, 1),
}
TASKS = ("maze", "maze9", "program")


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """One comparison run. `objective`, `train` and `sampler` are shared by every arm (each arm
    then sets its advantage / cov control and m); `train.seed` is the first of `num_seeds`
    consecutive RL seeds. Override with `section.key=value` like `vpo train`."""

    task: str = "maze"  # "maze" (5x5), "maze9" (the paper's 9x9), "program"
    model: str = "tiny"  # model preset (vpo.config.MODEL_PRESETS)
    arms: str = "grpo,multi_rlvr,vpo"  # comma-separated names from ARMS
    num_answers: int = 3  # m of the multi-answer arms
    num_seeds: int = 2
    init: str = ""  # a policy folder or hf:/path every arm starts from instead of SFT
    sft_steps: int = 300  # SFT warm start per m (skipped when `init` is set)
    sft_batch: int = 32
    sft_lr: float = 3e-3
    sft_mutation_fraction: float = 0.5  # share of SFT rows that are search mutation prompts
    eval_problems: int = 64
    eval_budget: int = 12  # candidates per problem, a multiple of every arm's m
    eval_seed: int = 4242  # held-out problem set (the paper's test seed)
    search_problems: int = 8  # the hardest eval problems for the evaluated policies
    devices: int = 1  # RL runs on the first `devices` devices (-1: all, a data-parallel mesh)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=300, batch_size=8, num_problems=1000, learning_rate=3e-4, checkpoint_every=10_000))
    sampler: SamplerConfig = dataclasses.field(default_factory=lambda: SamplerConfig(
        num_samples=8, temperature=1.0))
    search: SearchConfig = dataclasses.field(default_factory=lambda: SearchConfig(
        islands=4, members=6, parents=2, children=6, generations=6, num_answers=1))

    def __post_init__(self):
        names = self.arm_names
        unknown = [a for a in names if a not in ARMS]
        if unknown or not names:
            raise ConfigError(f"arms: unknown arm(s) {', '.join(unknown) or '(none)'}; choose "
                              f"from {', '.join(ARMS)} (comma-separated)")
        if self.task not in TASKS:
            raise ConfigError(f"task: {self.task!r} is not one of {', '.join(TASKS)}")
        if self.devices == 0 or self.devices < -1:
            raise ConfigError(f"devices: must be >= 1 or -1 (all); got {self.devices}")
        for f in ("num_answers", "num_seeds", "sft_batch", "eval_problems",
                  "eval_budget", "search_problems"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{f}: must be >= 1; got {getattr(self, f)}")
        for m in {self.arm_answers(a) for a in names}:
            if self.eval_budget % m:
                raise ConfigError(f"eval_budget: {self.eval_budget} must be a multiple of every "
                                  f"arm's m ({m}); e.g. {m * 4}")
            for f in ("members", "children"):
                if getattr(self.search, f) % m:
                    raise ConfigError(f"search.{f}: {getattr(self.search, f)} must be a multiple "
                                      f"of every arm's m ({m})")
        if self.sft_steps < 1 and not self.init:
            raise ConfigError("sft_steps: must be >= 1 unless init= names a policy to start from")
        if self.search_problems > self.eval_problems:
            raise ConfigError(f"search_problems: {self.search_problems} > eval_problems "
                              f"({self.eval_problems}); the hardest are picked from the eval set")

    @property
    def arm_names(self) -> list[str]:
        return [a.strip() for a in self.arms.split(",") if a.strip()]

    @property
    def seeds(self) -> list[int]:
        return [self.train.seed + i for i in range(self.num_seeds)]

    def arm_answers(self, arm: str) -> int:
        return ARMS[arm][1] or self.num_answers


def _paper_objective() -> ObjectiveConfig:
    """VPO paper §1.6 (algorithms.md): PPO clip 0.2/0.2, dual clip 3, token-mean, k3 KL 1e-3,
    K = 100 Dirichlet(α = 1) weights, no entropy bonus."""
    return ObjectiveConfig(num_weights=100, alpha=1.0, clip_eps_low=0.2, clip_eps_high=0.2,
                           dual_clip=3.0, kl_coef=1e-3, kl_estimator="k3", entropy_coef=0.0)


PRESETS: dict[str, CompareConfig] = {
    # CI: a few steps of everything (the test may shrink it further with overrides).
    "smoke": CompareConfig(
        num_seeds=1, sft_steps=40, eval_problems=8, eval_budget=6, search_problems=2,
        train=TrainConfig(steps=4, batch_size=8, num_problems=64, learning_rate=3e-4,
                          checkpoint_every=10_000),
        sampler=SamplerConfig(num_samples=4),
        search=SearchConfig(islands=2, members=3, parents=2, children=3, generations=2,
                            num_answers=1)),
    # <= 20 minutes on a quiet 2-core CPU: 3 arms x 3 seeds, tiny policy.
    "default": CompareConfig(num_seeds=3),
    # The paper's scale (VPO §1.6): Qwen3 policy, G = 8, m = 3, K = 100, α = 1, lr 1e-6 constant,
    # AdamW wd 0.01, k3 KL 1e-3, T = 1.0, 128 prompts/step, minibatch 64; 9x9 maze, 100 test
    # problems. Needs accelerators and the checkpoint in ~/ckpt/Qwen3-4B (`hf download Qwen/Qwen3-4B
    # --local-dir ~/ckpt/Qwen3-4B`, or init=hf:<folder>); see tpu_setup.sh.
    "paper": CompareConfig(
        task="maze9", model="qwen3-4b", arms="grpo,multi_rlvr,vpo", num_answers=3, num_seeds=3,
        init="hf:~/ckpt/Qwen3-4B", sft_steps=0, devices=-1, eval_problems=100, eval_budget=30,
        search_problems=32,
        objective=_paper_objective(),
        # 2 epochs of the 1000 training mazes at 128 prompts per step (VPO §1.4, §1.6).
        train=TrainConfig(steps=16, batch_size=128, num_minibatches=2, num_problems=1000,
                          learning_rate=1e-6, weight_decay=0.01, max_grad_norm=1.0,
                          checkpoint_every=8, seed=42),
        sampler=SamplerConfig(num_samples=8, temperature=1.0, top_p=1.0),
        search=SearchConfig(islands=8, members=12, parents=2, children=12, generations=20,
                            num_answers=1)),
}


def make_config(preset: str = "default", overrides: list[str] | tuple[str, ...] = ()
                ) -> CompareConfig:
    """A preset with typed `section.key=value` overrides (`vpo.config.apply_overrides`)."""
    if preset not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {preset!r}; choose one of "
                          f"{', '.join(PRESETS)}")
    return apply_overrides(PRESETS[preset], list(overrides))


def make_task(cfg: CompareConfig):
    """The comparison's task bound to its tokenizer: the `init` checkpoint's own tokenizer, or
    the task's word-level tokenizer for a preset model trained from scratch."""
    return checkpoint.load_task(cfg.task, cfg.init or None)


# -- statistics -------------------------------------------------------------------------------
# -- stages -----------------------------------------------------------------------------------

@dataclasses.dataclass
class ArmRun:
    """One trained (arm, seed): its run folder, final policy and per-step training metrics."""

    arm: str
    seed: int
    num_answers: int
    out_dir: str
    model: Any
    metrics: list[dict[str, float]]


def _seq_len(cfg: CompareConfig, task, m: int) -> int:
    """Positions a policy needs: prompt + m answers, and a search mutation prompt + m answers
    (measured on the evaluation problems, with a margin for longer ones)."""
    records = task.make_problems(cfg.eval_seed, 16)
    return max(512, seq_len_for(task, records, m, num_parents=cfg.search.parents) + 64)


def warm_start(cfg: CompareConfig, task, out_dir: str, log=print) -> dict[int, Any]:
    """{m: policy} for every m the arms use: `run_sft` on m-answer demonstrations, a share
    `sft_mutation_fraction` of them search mutation prompts (same steps, batch, lr and seed),
    saved to out_dir/sft_m<m>; or the `init` policy for every m."""
    policies = {}
    for m in sorted({cfg.arm_answers(a) for a in cfg.arm_names}):
        if cfg.init:
            policies[m] = load_model(cfg.init, max_seq_len=_seq_len(cfg, task, m))[0]
            continue
        mcfg = model_preset(cfg.model, vocab_size=task.tokenizer.size,
                            max_seq_len=_seq_len(cfg, task, m))
        graphdef, state, losses = run_sft(task, mcfg, cfg.sft_steps, batch_size=cfg.sft_batch,
                                          learning_rate=cfg.sft_lr, num_answers=m,
                                          seed=cfg.train.seed,
                                          mutation_fraction=cfg.sft_mutation_fraction,
                                          mutation_parents=cfg.search.parents)
        path = os.path.join(out_dir, f"sft_m{m}")
        checkpoint.save_policy(path, mcfg, state.params,
                               {"task": cfg.task, "num_answers": m, "sft_steps": cfg.sft_steps,
                                "sft_loss_first": losses[0], "sft_loss_last": losses[-1]},
                               tokenizer=task.tokenizer)
        log(f"  SFT m={m}: loss {losses[0]:.3f} -> {losses[-1]:.3f} ({path})")
        policies[m] = model_of(graphdef, state)
    return policies


def _copy(model):
    """The same policy on fresh buffers (the trainer donates its state; the warm start is
    shared by several runs)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jax.numpy.copy, state))


def arm_run_config(cfg: CompareConfig, task, arm: str, seed: int, model_cfg):
    """The `RunConfig` of one arm and seed: the shared sections, then the arm's changes."""
    changes, _ = ARMS[arm]
    m = cfg.arm_answers(arm)
    return RunConfig(
        model=model_cfg,
        sampler=dataclasses.replace(cfg.sampler, max_new_tokens=task.completion_len(m)),
        objective=dataclasses.replace(cfg.objective, **changes),
        train=dataclasses.replace(cfg.train, seed=seed, num_answers=m,
                                  mutation_parents=cfg.search.parents),
        task=cfg.task, mesh_data=-1 if cfg.devices == -1 else cfg.devices)


def train_arms(cfg: CompareConfig, task, policies: dict[int, Any], out_dir: str, log=print
               ) -> dict[str, list[ArmRun]]:
    """RL for every arm and seed from its m's warm start → {arm: [ArmRun per seed]}."""
    devices = jax.devices() if cfg.devices == -1 else jax.devices()[:cfg.devices]
    mesh = sharding.make_mesh(devices=devices)
    runs: dict[str, list[ArmRun]] = {}
    for arm in cfg.arm_names:
        m = cfg.arm_answers(arm)
        for seed in cfg.seeds:
            run = arm_run_config(cfg, task, arm, seed, policies[m].cfg)
            path = os.path.join(out_dir, "arms", arm, f"seed{seed}")
            t0 = time.perf_counter()
            graphdef, state = train(run, path, task=task, mesh=mesh, progress=False,
                                    init=_copy(policies[m]))
            with open(os.path.join(path, JSONL)) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            runs.setdefault(arm, []).append(ArmRun(arm, seed, m, path, model_of(graphdef, state),
                                                   rows))
            log(f"  {arm} seed {seed}: {len(rows)} steps, reward {rows[0]['reward']:.3f} -> "
                f"{rows[-1]['reward']:.3f}, entropy {rows[0]['entropy']:.3f} -> "
                f"{rows[-1]['entropy']:.3f} ({time.perf_counter() - t0:.0f} s)")
    return runs


def _policy_rows(cfg, policies, runs):
    """(row name, arm, seed, m, model) for the warm starts and every trained arm and seed."""
    rows = [(f"sft (m={m})", "sft", cfg.train.seed, m, p) for m, p in policies.items()]
    for arm, seed_runs in runs.items():
        rows += [(arm, arm, r.seed, r.num_answers, r.model) for r in seed_runs]
    return rows


def evaluate_arms(cfg: CompareConfig, task, policies, runs) -> dict[str, Any]:
    """Budget-fair evaluation on cfg.eval_problems held-out problems: per row and seed the
    metrics of `evaluation.summarize_pool` + entropy, and per-problem best score / solved."""
    records = task.make_problems(cfg.eval_seed, cfg.eval_problems)
    ks = policy_eval.default_ks(cfg.eval_budget)
    out: dict[str, Any] = {"ks": ks, "rows": {}}
    for name, _, seed, m, model in _policy_rows(cfg, policies, runs):
        metrics, per = policy_eval.evaluate_policy_per_problem(
            model, task, records, num_answers=m, budget=cfg.eval_budget, ks=ks,
            key=jax.random.fold_in(jax.random.key(cfg.eval_seed), seed))
        out["rows"].setdefault(name, []).append(
            {"seed": seed, "m": m, **metrics, **{k: v.tolist() for k, v in per.items()}})
    return out


def hardest_problems(evals: dict[str, Any], num: int) -> list[int]:
    """Indices of the `num` eval problems that were hardest for all evaluated policies (warm
    starts and every arm and seed, equally weighted per row): lowest solved fraction first, then
    lowest mean best candidate score; ties keep the problem order."""
    per_row = [(np.mean([r["solved_P"] for r in rs], 0), np.mean([r["best_P"] for r in rs], 0))
               for rs in evals["rows"].values()]
    solved = np.mean([s for s, _ in per_row], axis=0)
    best = np.mean([b for _, b in per_row], axis=0)
    return [int(i) for i in np.lexsort((np.arange(best.size), best, solved))[:num]]


def search_arms(cfg: CompareConfig, task, policies, runs, problem_idx: list[int]
                ) -> dict[str, Any]:
    """Island search (`vpo.search.run_method`) with each row's policy as mutation operator on
    the chosen eval problems at the same budget (the search key is shared by all rows)."""
    records = task.make_problems(cfg.eval_seed, cfg.eval_problems)
    sub = [records[i] for i in problem_idx]
    out: dict[str, Any] = {"problems": problem_idx, "budget": cfg.search.budget, "rows": {}}
    for name, _, seed, m, model in _policy_rows(cfg, policies, runs):
        scfg = dataclasses.replace(cfg.search, num_answers=m)
        problems = search.search_problems(task, sub, m)
        _, trace = search.run_method("search", model, task, problems, scfg,
                                     jax.random.key(cfg.eval_seed))
        s = search.summarize({name: trace})[name]
        out["rows"].setdefault(name, []).append(
            {"seed": seed, "m": m, "evaluated": s["evaluated"], "solved_count": s["solved_count"],
             "mean_best_fitness": s["mean_best_fitness"],
             "solved_P": np.asarray(trace.solved)[:, -1].tolist()})
    return out


# -- summary, claims and the report -------------------------------------------------------------

def run_compare(cfg: CompareConfig, out_dir: str, *, command: str = "vpo compare",
                log=print, with_search: bool = True) -> dict[str, Any]:
    """All stages; writes out_dir/report.md and friends and returns the summary."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=1)
    task = make_task(cfg)
    wall: dict[str, float] = {}
    loads = [compare_report.machine_load()]

    def stage(name, fn):
        log(f"[{name}]")
        t0 = time.perf_counter()
        result = fn()
        wall[name] = time.perf_counter() - t0
        log(f"[{name}] {wall[name]:.1f} s")
        return result

    policies = stage("warm start", lambda: warm_start(cfg, task, out_dir, log))
    runs = stage("RL", lambda: train_arms(cfg, task, policies, out_dir, log))
    evals = stage("evaluation", lambda: evaluate_arms(cfg, task, policies, runs))
    searches = None
    if with_search:
        idx = hardest_problems(evals, cfg.search_problems)
        searches = stage("search", lambda: search_arms(cfg, task, policies, runs, idx))
    law = {}
    for arm in ("grpo", "clip_cov", "kl_cov", "entropy_mask", "multi_rlvr", "vpo"):
        if arm in runs and cfg.train.steps >= 4:
            rs = runs[arm]
            H = np.mean([[r["entropy"] for r in s.metrics] for s in rs], axis=0)
            R = np.mean([[r["reward"] for r in s.metrics] for s in rs], axis=0) / rs[0].num_answers
            law[arm] = entropy_law.entropy_law_report(H, R)
    wall["total"] = sum(wall.values())
    loads.append(compare_report.machine_load())
    summary = compare_report.write_report(out_dir, cfg, command=command, wall=wall, runs=runs,
                                          evals=evals, searches=searches, law=law,
                                          load=" -> ".join(loads))
    log(f"report: {os.path.join(out_dir, 'report.md')} ({wall['total']:.0f} s)")
    return summary
