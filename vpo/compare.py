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
The entropy law R = -a·exp(H) + b (Cui et al.) is fitted by `fit_entropy_law`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from vpo import checkpoint, plots, policy_eval, search, sharding
from vpo.config import ConfigError, SamplerConfig, apply_overrides, model_preset
from vpo.loop import train
from vpo.metrics_log import JSONL
from vpo.search import SearchConfig
from vpo.sft import run_sft
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


def make_task(name: str):
    """The comparison's task: "maze" (5x5), "maze9" (the paper's 9x9 maze) or "program"."""
    from vpo.tasks import maze, program

    if name == "maze9":
        return maze.make_paper_maze_task()
    return {"maze": maze.make_maze_task, "program": program.make_program_task}[name]()


# -- statistics -------------------------------------------------------------------------------

def mean_ci(values) -> tuple[float, float]:
    """Mean and the half-width of a 95% Student-t interval over seeds, t_{0.975, n-1}·s/√n
    (s the unbiased std); half-width NaN for a single seed."""
    from scipy import stats

    x = np.asarray(values, float)
    if x.size < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1)
                                  / math.sqrt(x.size))


def fit_entropy_law(entropy_S, reward_S) -> tuple[float, float]:
    """Least squares fit of R = -a·exp(H) + b (Cui et al., arXiv 2505.22617) on the regressors
    [-exp(H), 1] → (a, b); the predicted ceiling at H = 0 is b - a."""
    H, R = np.asarray(entropy_S, float), np.asarray(reward_S, float)
    if H.shape != R.shape or H.size < 2:
        raise ValueError(f"fit_entropy_law: need >= 2 paired points; got {H.shape}, {R.shape}")
    X = np.stack([-np.exp(H), np.ones_like(H)], axis=-1)
    (a, b), *_ = np.linalg.lstsq(X, R, rcond=None)
    return float(a), float(b)


def entropy_law_report(entropy_S, reward_S, *, bins: int = 10, fit_frac: float = 0.5
                       ) -> dict[str, float]:
    """Fit the entropy law on a training trajectory averaged into `bins` consecutive chunks of
    steps (per-step rewards are noisy): a, b, ceiling b - a and R² on all chunks; then refit on
    the first `fit_frac` of the chunks and report the RMSE of its prediction on the rest
    (`rmse_heldout`) next to the RMSE of predicting the early mean (`rmse_constant`)."""
    H, R = np.asarray(entropy_S, float), np.asarray(reward_S, float)
    if H.size < 4:
        raise ValueError(f"entropy_law_report: need >= 4 steps (2 to fit, 2 held out); got "
                         f"{H.size}")
    n = min(bins, H.size)
    Hb = np.array([c.mean() for c in np.array_split(H, n)])
    Rb = np.array([c.mean() for c in np.array_split(R, n)])
    a, b = fit_entropy_law(Hb, Rb)
    pred = b - a * np.exp(Hb)
    ss_res, ss_tot = float(np.sum((Rb - pred) ** 2)), float(np.sum((Rb - Rb.mean()) ** 2))
    k = min(max(2, round(fit_frac * n)), n - 1)
    ea, eb = fit_entropy_law(Hb[:k], Rb[:k])
    later = Rb[k:]
    return {"a": a, "b": b, "ceiling": b - a, "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0,
            "early_a": ea, "early_b": eb, "fit_chunks": k, "chunks": n,
            "rmse_heldout": float(np.sqrt(np.mean((later - (eb - ea * np.exp(Hb[k:]))) ** 2))),
            "rmse_constant": float(np.sqrt(np.mean((later - Rb[:k].mean()) ** 2))),
            "entropy_first": float(Hb[0]), "entropy_last": float(Hb[-1])}


def smooth(x, window: int) -> np.ndarray:
    """Trailing moving average over up to `window` steps (for plots of noisy per-step metrics)."""
    x = np.asarray(x, float)
    c = np.cumsum(np.concatenate([[0.0], x]))
    i = np.arange(1, x.size + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


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
    """Positions a policy needs: prompt + m answers, and a search mutation prompt + m answers."""
    need = task.prompt_len + task.completion_len(m)
    need = max(need, task.mutation_prompt_len(cfg.search.parents) + task.completion_len(m))
    return max(512, need)


def warm_start(cfg: CompareConfig, task, out_dir: str, log=print) -> dict[int, Any]:
    """{m: policy} for every m the arms use: `run_sft` on m-answer demonstrations, a share
    `sft_mutation_fraction` of them search mutation prompts (same steps, batch, lr and seed),
    saved to out_dir/sft_m<m>; or the `init` policy for every m."""
    policies = {}
    for m in sorted({cfg.arm_answers(a) for a in cfg.arm_names}):
        if cfg.init:
            from vpo.cli import load_model

            policies[m] = load_model(cfg.init, max_seq_len=_seq_len(cfg, task, m))[0]
            continue
        mcfg = model_preset(cfg.model, vocab_size=task.vocab.size,
                            max_seq_len=_seq_len(cfg, task, m))
        graphdef, state, losses = run_sft(task, mcfg, cfg.sft_steps, batch_size=cfg.sft_batch,
                                          learning_rate=cfg.sft_lr, num_answers=m,
                                          seed=cfg.train.seed,
                                          mutation_fraction=cfg.sft_mutation_fraction,
                                          mutation_parents=cfg.search.parents)
        path = os.path.join(out_dir, f"sft_m{m}")
        checkpoint.save_policy(path, mcfg, state.params,
                               {"task": cfg.task, "num_answers": m, "sft_steps": cfg.sft_steps,
                                "sft_loss_first": losses[0], "sft_loss_last": losses[-1]})
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
        train=dataclasses.replace(cfg.train, seed=seed, num_answers=m),
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
    problems = task.make_problems(cfg.eval_seed, cfg.eval_problems)
    ks = policy_eval.default_ks(cfg.eval_budget)
    out: dict[str, Any] = {"ks": ks, "rows": {}}
    for name, _, seed, m, model in _policy_rows(cfg, policies, runs):
        metrics, per = policy_eval.evaluate_policy_per_problem(
            model, task, problems, num_answers=m, budget=cfg.eval_budget, ks=ks,
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
    problems = task.make_problems(cfg.eval_seed, cfg.eval_problems)
    sub = jax.tree.map(lambda x: np.asarray(x)[np.asarray(problem_idx)], problems)
    out: dict[str, Any] = {"problems": problem_idx, "budget": cfg.search.budget, "rows": {}}
    for name, _, seed, m, model in _policy_rows(cfg, policies, runs):
        scfg = dataclasses.replace(cfg.search, num_answers=m)
        _, trace = search.run_method("search", model, task, sub, scfg,
                                     jax.random.key(cfg.eval_seed))
        s = search.summarize({name: trace})[name]
        out["rows"].setdefault(name, []).append(
            {"seed": seed, "m": m, "evaluated": s["evaluated"], "solved_count": s["solved_count"],
             "mean_best_fitness": s["mean_best_fitness"],
             "solved_P": np.asarray(trace.solved)[:, -1].tolist()})
    return out


# -- summary, claims and the report -------------------------------------------------------------

TAIL_FRAC = 0.2  # "late training" = the last 20% of steps
TIE = 5e-4  # differences below this (the table's precision) count as ties, i.e. not "higher"


def _higher(v: float, g: float) -> bool:
    return v > g + TIE


def _tail_mean(rows: list[dict[str, float]], key: str) -> float:
    n = max(1, round(TAIL_FRAC * len(rows)))
    return float(np.mean([r[key] for r in rows[-n:]]))


def headline(cfg: CompareConfig, runs, evals, searches) -> dict[str, dict[str, Any]]:
    """Per row (warm starts, arms): seeds and {metric: [value per seed]} for the table."""
    N = cfg.eval_budget
    out = {}
    for name, rows in evals["rows"].items():
        vals = {f"best@1": [r["best@1"] for r in rows], f"best@{N}": [r[f"best@{N}"] for r in rows],
                f"pass@{N}": [r[f"pass@{N}"] for r in rows],
                "diversity": [r["diversity"] for r in rows],
                "distinct": [r["distinct"] for r in rows], "entropy": [r["entropy"] for r in rows]}
        if name in runs:
            vals["train entropy"] = [_tail_mean(r.metrics, "entropy") for r in runs[name]]
            vals["train diversity"] = [_tail_mean(r.metrics, "diversity") for r in runs[name]]
        if searches is not None:
            vals["search solved"] = [s["solved_count"][-1] for s in searches["rows"][name]]
        out[name] = {"m": rows[0]["m"], "seeds": [r["seed"] for r in rows], "values": vals}
    return out


def _mean(head, row, metric) -> float:
    return float(np.mean(head[row]["values"][metric]))


def _fmt(values) -> str:
    mean, hw = mean_ci(values)
    return f"{mean:.3f}" if math.isnan(hw) else f"{mean:.3f} ± {hw:.3f}"


def claims(cfg: CompareConfig, head, evals, searches, law) -> list[dict[str, Any]]:
    """The issue's expected results, each checked against the measured numbers:
    {"claim", "holds" (bool), "evidence"}. A claim whose arms did not run is left out."""
    N, ks = cfg.eval_budget, evals["ks"]
    out = []

    def add(claim, holds, evidence):
        out.append({"claim": claim, "holds": bool(holds), "evidence": evidence})

    scalar = [a for a in ("grpo", "multi_rlvr") if a in head]
    if "vpo" in head:
        for base in scalar:
            v, g = _mean(head, "vpo", f"best@{N}"), _mean(head, base, f"best@{N}")
            add(f"VPO best@{N} >= {base} best@{N} (equal candidate budget)", v >= g - TIE,
                f"{v:.3f} vs {g:.3f}")
            gaps = [float(np.mean([r[f"best@{k}"] for r in evals["rows"]["vpo"]])
                          - np.mean([r[f"best@{k}"] for r in evals["rows"][base]])) for k in ks]
            add(f"the best@k gap VPO - {base} grows with k (k=1 -> k={N})",
                _higher(gaps[-1], gaps[0]),
                ", ".join(f"k={k}: {d:+.3f}" for k, d in zip(ks, gaps, strict=True)))
            for metric in ("diversity", "train diversity", "train entropy"):
                v, g = _mean(head, "vpo", metric), _mean(head, base, metric)
                what = {"diversity": "reward-space diversity of the eval candidates",
                        "train diversity": "reward-space diversity of training rollouts (last "
                                           "20% of steps)",
                        "train entropy": "token entropy of training rollouts (last 20% of "
                                         "steps)"}[metric]
                add(f"VPO keeps higher {what} than {base}", _higher(v, g),
                    f"{v:.3f} vs {g:.3f}")
            if searches is not None:
                solved = {a: np.any([s["solved_P"] for s in searches["rows"][a]], axis=0)
                          for a in ("vpo", base)}
                only_v = int(np.sum(solved["vpo"] & ~solved[base]))
                only_b = int(np.sum(solved[base] & ~solved["vpo"]))
                add(f"in search, VPO's policy solves problems {base}'s never does (any seed, "
                    f"budget {searches['budget']})", only_v > 0,
                    f"{only_v} solved only by VPO, {only_b} only by {base}, of "
                    f"{len(searches['problems'])} hardest problems")
    if "grpo" in law:
        r = law["grpo"]
        add("the entropy law R = -a·exp(H) + b fits GRPO's trajectory (R² >= 0.5, a > 0, and the "
            "early fit predicts later steps better than a constant)",
            r["r2"] >= 0.5 and r["a"] > 0 and r["rmse_heldout"] < r["rmse_constant"],
            f"a={r['a']:.3f}, b={r['b']:.3f}, ceiling {r['ceiling']:.3f}, R² {r['r2']:.2f}, "
            f"held-out RMSE {r['rmse_heldout']:.4f} vs constant {r['rmse_constant']:.4f}")
    for arm in ("clip_cov", "kl_cov", "entropy_mask"):
        if arm in head and "grpo" in head:
            v, g = _mean(head, arm, "train entropy"), _mean(head, "grpo", "train entropy")
            add(f"{arm} keeps training entropy above plain GRPO", _higher(v, g),
                f"{v:.3f} vs {g:.3f}")
    return out


def write_report(out_dir: str, cfg: CompareConfig, *, command: str, wall: dict[str, float],
                 runs, evals, searches, law, load: str = "") -> dict[str, Any]:
    """report.md, summary.json and the PNGs (best@k, pass@k, training curves, search, and all
    four in report.png) in out_dir; returns the summary."""
    head = headline(cfg, runs, evals, searches)
    checked = claims(cfg, head, evals, searches, law)
    ks, N = evals["ks"], cfg.eval_budget
    means = {name if name.startswith("sft") else f"{name} (m={h['m']})": {k: float(np.mean([r[k] for r in evals["rows"][name]]))
                                      for k in evals["rows"][name][0]
                                      if isinstance(evals["rows"][name][0][k], float)}
             for name, h in head.items()}
    policy_eval.write_report(out_dir, means, ks, title=f"{cfg.task}: {cfg.eval_problems} "
                             f"problems, {N} candidates each (mean over seeds)")
    window = max(1, cfg.train.steps // 15)
    panels: dict[str, dict] = {"entropy": {}, "diversity": {}, "reward per answer slot": {}}
    for arm, seed_runs in runs.items():
        steps = [r["step"] for r in seed_runs[0].metrics]
        for metric, key in (("entropy", "entropy"), ("diversity", "diversity"),
                            ("reward per answer slot", "reward")):
            ys = np.mean([[r[key] for r in s.metrics] for s in seed_runs], axis=0)
            ys = ys / seed_runs[0].num_answers if key == "reward" else ys
            panels[metric][arm] = (steps, smooth(ys, window))
    if runs:
        plots.plot_metrics_over_steps(os.path.join(out_dir, "training.png"), panels,
                                      title=f"training (mean over seeds, {window}-step average)")
    if searches is not None:
        curves = {name: (rows[0]["evaluated"], np.mean([r["solved_count"] for r in rows], 0))
                  for name, rows in searches["rows"].items()}
        plots.plot_metric_vs_k(os.path.join(out_dir, "search_solved.png"), curves,
                               metric=f"solved (of {len(searches['problems'])})", log_x=False,
                               xlabel="candidates evaluated per problem",
                               title="island search on the hardest problems (mean over seeds)")
    layout = [["best_at_k.png", "pass_at_k.png"]
              + (["search_solved.png"] if searches is not None else []), ["training.png"]]
    plots.combine_pngs(os.path.join(out_dir, "report.png"),
                       [[os.path.join(out_dir, n) for n in row if n != "training.png" or runs]
                        for row in layout],
                       title=f"vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}")
    summary = {"config": dataclasses.asdict(cfg), "command": command, "wall_s": wall,
               "load": load, "headline": head, "claims": checked, "entropy_law": law,
               "eval": evals, "search": searches,
               "train": {arm: [{"seed": r.seed, "dir": os.path.relpath(r.out_dir, out_dir),
                                "metrics": r.metrics} for r in rs] for arm, rs in runs.items()}}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(_report_text(cfg, command, wall, head, checked, law, searches, load))
    return summary


def _report_text(cfg, command, wall, head, checked, law, searches, load) -> str:
    N = cfg.eval_budget
    metrics = [f"best@1", f"best@{N}", f"pass@{N}", "diversity", "distinct", "entropy",
               "train entropy", "train diversity", "search solved"]
    metrics = [k for k in metrics if any(k in h["values"] for h in head.values())]
    seeds = max(len(h["seeds"]) for h in head.values())
    ms = sorted({h["m"] for h in head.values()})
    lines = [f"# vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}", "",
             f"`{command}`", "",
             f"Policy `{cfg.model}`{' from ' + cfg.init if cfg.init else ''}; "
             f"{cfg.train.steps} RL steps x {cfg.train.batch_size} prompts x G = "
             f"{cfg.sampler.num_samples} samples, lr {cfg.train.learning_rate:g}, seeds "
             f"{cfg.seeds}. Arms: " + "; ".join(_arm_text(a, cfg) for a in cfg.arm_names) + ".",
             "",
             f"Evaluation: {cfg.eval_problems} held-out problems (seed {cfg.eval_seed}), N = {N} "
             f"candidates per problem for every policy (N/m generations of m answers). Search: "
             f"island search with the policy as mutation operator on the "
             f"{cfg.search_problems} eval problems hardest for all policies above (fewest "
             f"solved, then lowest best score), "
             f"{searches['budget'] if searches else 0} candidates per problem. Cells: mean "
             + ("± half-width of a 95% Student-t interval over seeds." if seeds > 1 else
                "(one seed)."), "",
             "| policy | m | seeds | " + " | ".join(metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for name, h in head.items():
        cells = [_fmt(h["values"][k]) if k in h["values"] else "" for k in metrics]
        lines.append(f"| {name} | {h['m']} | {len(h['seeds'])} | " + " | ".join(cells) + " |")
    lines += ["", "best@k: mean over problems of the best w*ᵀr among k candidates; pass@k: "
              "unbiased probability that k candidates contain a solution; diversity: mean "
              "pairwise L1 distance of valid candidates' reward vectors; distinct: distinct "
              "valid answers; train entropy / diversity: last 20% of training steps; search "
              f"solved: problems solved of {cfg.search_problems}. The warm-start rows "
              f"(sft, m in {ms}) are the common starting points.", "",
              "## What reproduced and what did not", "",
              "Computed from the numbers above (a claim holds if the means say so; with few "
              "seeds and overlapping intervals it is not significant).", ""]
    for c in checked:
        lines.append(f"- **{'reproduced' if c['holds'] else 'not reproduced'}**: {c['claim']}. "
                     f"{c['evidence']}.")
    warm = [n for n in head if n.startswith("sft")]
    if warm:
        lines += ["", "RL against its warm start (same m, mean over seeds): " + "; ".join(
            f"{arm} best@1 {_delta(head, arm, sft, 'best@1')}, best@{N} "
            f"{_delta(head, arm, sft, f'best@{N}')}, pass@{N} {_delta(head, arm, sft, f'pass@{N}')}"
            for arm in head if not arm.startswith("sft")
            for sft in [f"sft (m={head[arm]['m']})"] if sft in head) + "."]
    if law:
        lines += ["", "## Entropy law", "",
                  "R = -a·exp(H) + b fitted by least squares on [-exp(H), 1], H = mean token "
                  "entropy of training rollouts, R = training reward per answer slot (mean "
                  "w*ᵀr), both averaged over seeds and then into equal chunks of steps; the "
                  "early fit uses the first half of the chunks.", "",
                  "| arm | a | b | ceiling b-a | R² | held-out RMSE (early fit) | RMSE of a "
                  "constant | entropy first -> last chunk |", "|---|---|---|---|---|---|---|---|"]
        for arm, r in law.items():
            lines.append(f"| {arm} | {r['a']:.3f} | {r['b']:.3f} | {r['ceiling']:.3f} | "
                         f"{r['r2']:.2f} | {r['rmse_heldout']:.4f} | {r['rmse_constant']:.4f} | "
                         f"{r['entropy_first']:.3f} -> {r['entropy_last']:.3f} |")
    lines += ["", "## Figures", "", "![best@k](best_at_k.png) ![pass@k](pass_at_k.png)", "",
              "![training](training.png)", ""]
    if searches:
        lines += ["![search](search_solved.png)", ""]
    lines += ["## Wall time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in wall.items()]
    if load:
        lines += ["", f"Machine: {load}"]
    lines += ["", "Per-run metrics: `arms/<arm>/seed<k>/metrics.jsonl` (and TensorBoard under "
              "`tb/`); warm starts: `sft_m<m>/`; all numbers: `summary.json`.", ""]
    return "\n".join(lines)


def _delta(head, arm: str, base: str, metric: str) -> str:
    a, b = _mean(head, arm, metric), _mean(head, base, metric)
    return f"{b:.3f} -> {a:.3f}"


def _arm_text(arm: str, cfg: CompareConfig) -> str:
    m = cfg.arm_answers(arm)
    return {"grpo": "**grpo** = GRPO, 1 answer per generation, scalar reward w*ᵀr (the paper's "
                    "GRPO baseline)",
            "multi_rlvr": f"**multi_rlvr** = GRPO on {m} answers per generation with the summed "
                          "scalar Σ_j w*ᵀr_j (Multi-RLVR)",
            "vpo": f"**vpo** = VPO, {m} answers per generation, E_w~Dir({cfg.objective.alpha:g})"
                   f"[max_j wᵀr_j] with K = {cfg.objective.num_weights}",
            "clip_cov": "**clip_cov** = GRPO (m=1) with Clip-Cov",
            "kl_cov": "**kl_cov** = GRPO (m=1) with KL-Cov",
            "entropy_mask": "**entropy_mask** = GRPO (m=1), gradient on the top-20% entropy "
                            "tokens only"}[arm]


def machine_load() -> str:
    """CPU count and 1-minute load average, for the report (timings depend on both)."""
    try:
        load = f", load average {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    return f"{os.cpu_count()} CPUs{load}, JAX backend {jax.default_backend()}"


def run_compare(cfg: CompareConfig, out_dir: str, *, command: str = "vpo compare",
                log=print, with_search: bool = True) -> dict[str, Any]:
    """All stages; writes out_dir/report.md and friends and returns the summary."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=1)
    task = make_task(cfg.task)
    wall: dict[str, float] = {}
    loads = [machine_load()]

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
            law[arm] = entropy_law_report(H, R)
    wall["total"] = sum(wall.values())
    loads.append(machine_load())
    summary = write_report(out_dir, cfg, command=command, wall=wall, runs=runs, evals=evals,
                           searches=searches, law=law, load=" -> ".join(loads))
    log(f"report: {os.path.join(out_dir, 'report.md')} ({wall['total']:.0f} s)")
    return summary
