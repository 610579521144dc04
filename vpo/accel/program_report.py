"""What a compiled program needs on a target: compiles or the compiler's error (named), bytes
per device against the chip's memory, collectives counted in the compiled HLO, kernel custom
calls, compile time; and, when it does not compile or fit, the setting to change.

Bytes per device = arguments + outputs − aliased (donated) + temporaries, from
`compiled.memory_analysis()`: the compiler's plan for one device, not a measurement.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from vpo.accel import build as build_lib
from vpo.accel import targets as targets_lib
from vpo.config import RunConfig
from vpo.env.task import EnvTask
from vpo.tasks.bound import BoundTask, HostTask, for_kind

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
CUSTOM_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu")
_COLLECTIVE_RE = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")

# error names: what stopped a program
DOES_NOT_FIT = "DoesNotFit"  # compiled; bytes per device above the chip's memory
HBM_OOM = "CompilerOutOfMemory"  # the compiler refused: device memory
SCRATCH_OOM = "KernelScratchOutOfMemory"  # a kernel's VMEM / shared memory
NOT_APPLICABLE = "NotApplicable"  # e.g. the in-graph searches of a host-scored task
SETTING = "SettingRefused"  # the inputs could not be made (mesh, batch split)
COMPILE_ERROR = "CompileError"


@dataclasses.dataclass
class ProgramReport:
    """One program on one target."""

    program: str
    target: str
    ok: bool  # compiled
    seconds: float
    hbm_bytes: int
    argument_bytes: int = 0
    output_bytes: int = 0
    temp_bytes: int = 0
    alias_bytes: int = 0
    collectives: dict[str, int] = dataclasses.field(default_factory=dict)
    custom_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    error_name: str | None = None
    error: str | None = None
    change: str | None = None
    applicable: bool = True  # False: the program does not exist for this run

    @property
    def bytes_per_device(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def fits(self) -> bool:
        return self.ok and self.bytes_per_device <= self.hbm_bytes

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(bytes_per_device=self.bytes_per_device, fits=self.fits)
        return out


def count_collectives(hlo_text: str) -> dict[str, int]:
    """{collective: instructions} in compiled HLO text (an async pair counts once)."""
    counts: dict[str, int] = {}
    for name in _COLLECTIVE_RE.findall(hlo_text):
        counts[name] = counts.get(name, 0) + 1
    return counts


def first_line(e: BaseException, limit: int = 300) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0][:limit] if lines else ''}"


def error_name(e: BaseException, stage: str) -> str:
    """The named kind of a failure (`SETTING`, `SCRATCH_OOM`, `HBM_OOM`, `COMPILE_ERROR`)."""
    text = str(e)
    if stage == "build":
        return SETTING
    if re.search(r"vmem|E1001|shared memory|smem", text, re.I):
        return SCRATCH_OOM
    if re.search(r"RESOURCE_EXHAUSTED|out of memory|exceeds.*memory|hbm", text, re.I):
        return HBM_OOM
    return COMPILE_ERROR


def from_built(built, target, hbm_bytes: int) -> ProgramReport:
    """A report of a `vpo.accel.build.Built`."""
    name = getattr(target, "name", str(target))
    if built.compiled is None:
        return ProgramReport(built.name, name, False, round(built.seconds, 1), hbm_bytes,
                             error_name=error_name(built.error, built.stage),
                             error=first_line(built.error))
    text = built.compiled.as_text()
    mem = built.compiled.memory_analysis()
    sizes = {k: int(getattr(mem, f"{k}_size_in_bytes", 0) or 0) if mem is not None else 0
             for k in ("argument", "output", "temp", "alias")}
    report = ProgramReport(built.name, name, True, round(built.seconds, 1), hbm_bytes,
                           sizes["argument"], sizes["output"], sizes["temp"], sizes["alias"],
                           collectives=count_collectives(text),
                           custom_calls={c: text.count(c) for c in CUSTOM_CALLS if c in text})
    if not report.fits:
        report.error_name = DOES_NOT_FIT
        report.error = (f"needs {gib(report.bytes_per_device)} per device, the chip has "
                        f"{gib(hbm_bytes)}")
    return report


def from_kernel_row(row: dict, target, hbm_bytes: int) -> ProgramReport:
    """A report of one `vpo.kernels.aot_check.compile_cell` row."""
    name = f"kernel {row['kernel']} {row['pass']} {tuple(row['shape'])}"
    mem = row.get("memory") or {}
    report = ProgramReport(name, getattr(target, "name", str(target)), row["ok"],
                           row["seconds"], hbm_bytes, mem.get("argument", 0),
                           mem.get("output", 0), mem.get("temp", 0), mem.get("alias", 0),
                           custom_calls=row.get("custom_calls") or {})
    if not row["ok"]:
        report.error = row["error"]
        report.error_name = error_name(RuntimeError(row["error"]), "compile")
    return report


def advise(report: ProgramReport, run: RunConfig, n_devices: int) -> str | None:
    """The settings to change, most effective first, for a program that does not compile or
    fit; None when it fits."""
    if report.fits or not report.applicable:
        return None
    if report.error_name == SETTING:
        return "the setting named in the error"
    if report.error_name == SCRATCH_OOM:
        return "train.logprob_impl=chunked (or a smaller train.vocab_block)"
    if report.error_name == COMPILE_ERROR:
        if "output tile sizes" in (report.error or ""):  # XLA:GPU's Triton GEMM tiling
            return ("XLA_FLAGS=--xla_gpu_enable_triton_gemm=false (XLA's Triton GEMM finds no "
                    "tiling for a dot of these shapes)")
        return None
    t, s = run.train, run.sampler
    options = []
    program = report.program
    episodes = program.startswith(("env_prefill", "env_advance"))
    if n_devices > run.mesh_fsdp and program != "sampler" and not program.startswith("kernel"):
        options.append(f"mesh_fsdp={n_devices} (parameters and optimiser state sharded over "
                       "the devices)")
    if run.model.lora_rank == 0 and program in ("rl_step", "rl_update", "env_update",
                                                "sft_step"):
        options.append("model.lora_rank=16 (only adapters trained: no moments of the base)")
    if program in ("search", "search_learn"):
        options.append("fewer search.islands or search.children, or --search-problems (the "
                       "problems searched at once)")
    if program in ("rl_step", "rl_update", "env_update"):
        options.append(f"train.num_minibatches={2 * t.num_minibatches} (or train.grad_accum; "
                       "train.batch_size must stay divisible)")
        if not t.remat:
            options.append("train.remat=true")
    if (program in ("rl_step", "rl_sample", "sampler", "search") or episodes) and (
            s.num_samples > 2):
        options.append(f"sampler.num_samples={s.num_samples // 2}")
    if episodes and s.max_new_tokens > 16:
        options.append(f"sampler.max_new_tokens={s.max_new_tokens // 2} (an episode's token "
                       "budget; its cache holds twice as many slots)")
    rollouts = t.batch_size * s.num_samples
    if program == "sampler" and not 0 < s.num_slots < rollouts and rollouts >= 8:
        options.append(f"sampler.num_slots={rollouts // 4} (suffix caches for those rows, "
                       "not for every rollout)")
    if program in ("sft_step", "sampler") or episodes or not options:
        options.append(f"train.batch_size={max(1, t.batch_size // 2)}")
    return "; or ".join(options)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def render(reports: list[ProgramReport]) -> str:
    """A plain-text table, one line per program, with the error and the change below it."""
    lines = [f"{'program':<50} {'target':<8} {'compiles':<8} {'per device':>11} "
             f"{'of chip':>8} {'fits':<4} {'collectives':<30} {'seconds':>7}"]
    for r in reports:
        coll = ", ".join(f"{k} {v}" for k, v in sorted(r.collectives.items())) or "-"
        per = gib(r.bytes_per_device) if r.ok else "-"
        share = f"{100 * r.bytes_per_device / r.hbm_bytes:.0f}%" if r.ok else "-"
        lines.append(f"{r.program:<50} {r.target:<8} {'yes' if r.ok else 'no':<8} {per:>11} "
                     f"{share:>8} {'yes' if r.fits else 'no':<4} {coll:<30} {r.seconds:>7.1f}")
        if r.ok and r.custom_calls:
            lines.append(f"    kernels: {', '.join(f'{k} {v}' for k, v in r.custom_calls.items())}")
        if r.error_name:
            lines.append(f"    {r.error_name}: {r.error}")
        if r.change:
            lines.append(f"    change: {r.change}")
    return "\n".join(lines)


def _env_run(task: EnvTask) -> str:
    return f"an environment run (--env {task.settings.spec})"


@dataclasses.dataclass(frozen=True)
class KindPlan:
    """What `vpo plan` builds for one task kind: `missing(task)` → {program: why it does not
    exist}, `rl_step(run, task, mesh)` → the RL step's built programs, `decode_kernel(task)` →
    None when the sampler's decode-attention kernel is built, else why not, and `decoding(run,
    task)` → how its rollouts decode, in words."""

    missing: Callable[[BoundTask], dict[str, str]]
    rl_step: Callable[..., list[build_lib.Built]]
    decode_kernel: Callable[[BoundTask], str | None]
    decoding: Callable[[RunConfig, BoundTask], str]


def decode_rows(num_slots: int, rollouts: int) -> str:
    """The sampler's rows as the plan states them: S refilled slots, or every rollout."""
    from vpo.rollout.slots import uses_slots

    if uses_slots(num_slots, rollouts):
        return f"S={num_slots} slots (sampler.num_slots) for the {rollouts} rollouts"
    return f"all {rollouts} rows (sampler.num_slots=0)"


def _decoded(run: RunConfig, task: BoundTask) -> str:
    return "decoded in " + decode_rows(run.sampler.num_slots,
                                       run.train.batch_size * run.sampler.num_samples)


def _episodes(run: RunConfig, task: EnvTask) -> str:
    """An environment run's episodes as the plan builds them (`vpo.accel.env_build`)."""
    from vpo.accel.env_build import episode_shapes
    from vpo.env.episode import queue_widths

    s, settings = episode_shapes(run), task.settings
    return (f"in episodes of {settings.spec}: up to {settings.max_turns} turns, "
            f"{s.budget} tokens each (assistant and observations) in a cache of {s.slots} "
            f"slots, observation queues of {' and '.join(map(str, s.widths))} tokens built "
            f"(a run compiles each of {', '.join(map(str, queue_widths(s.budget)))}); "
            "the environment's calls run on the host between the programs")


def _env_missing(task: EnvTask) -> dict[str, str]:
    why = {"sampler": "it samples in episodes (env_prefill, env_advance of rl_step)",
           "sft_step": "an environment has no demonstrations (warm-start its policy with "
                       "vpo sft --data)",
           "search": "an environment scores whole episodes on the host (no in-graph search)",
           "search_learn": "an environment scores whole episodes on the host (no in-graph "
                           "search to learn in)"}
    return {name: f"{_env_run(task)}: {text}" for name, text in why.items()}


def _env_rl_step(run: RunConfig, task: EnvTask, mesh) -> list[build_lib.Built]:
    from vpo.accel.env_build import build_env_step  # imports the episode loop

    return build_env_step(run, task, mesh)


_IN_GRAPH = KindPlan(missing=lambda task: {},
                     rl_step=lambda run, task, mesh: build_lib.build("rl_step", run, task, mesh),
                     decode_kernel=lambda task: None, decoding=_decoded)
# the plan of each task kind
KIND_PLANS = {
    BoundTask: _IN_GRAPH,
    HostTask: dataclasses.replace(_IN_GRAPH, missing=lambda task: {
        "search": f"task {task.name!r} scores on the host (no in-graph search)",
        "search_learn": f"task {task.name!r} scores on the host (the search learns from an "
                        "in-graph reward)"}),
    EnvTask: KindPlan(missing=_env_missing, rl_step=_env_rl_step,
                      decode_kernel=lambda task: (f"{_env_run(task)}: episodes attend through "
                                                  "XLA (Decoder.extend_masked, a mask per "
                                                  "episode), not the decode kernel"),
                      decoding=_episodes),
}


def decoding(run: RunConfig, task: BoundTask) -> str:
    """How a run's rollouts decode, as `vpo plan` states them (slots, rows or episodes)."""
    return for_kind(KIND_PLANS, task).decoding(run, task)


def plan(run: RunConfig, task: BoundTask, target, programs=build_lib.PROGRAMS,
         progress=None, search: build_lib.SearchSettings | None = None) -> list[ProgramReport]:
    """Compile each of `programs` for `target` (a `vpo.accel.targets.Target` or its spelling)
    on the run's mesh (mesh_data / mesh_fsdp / mesh_tensor) and report it, with the change to
    make where it does not compile or fit. `progress(report)` is called as each one finishes;
    `search`: the search programs' settings (`vpo.accel.build.SearchSettings`)."""
    if isinstance(target, str):
        target = targets_lib.parse_target(target)
    hbm = target.chip.hbm_bytes
    out = []

    def add(report):
        report.change = report.change or advise(report, run, target.n_devices)
        out.append(report)
        if progress is not None:
            progress(report)

    mesh = targets_lib.mesh(target, run.mesh_data, run.mesh_fsdp, run.mesh_tensor)
    kind = for_kind(KIND_PLANS, task)
    missing = kind.missing(task)
    for name in programs:
        if name == "kernels":
            devs = targets_lib.devices(target)
            no_decode = kind.decode_kernel(task)
            for row in build_lib.build_kernels(run, task, devs, decode=no_decode is None):
                add(from_kernel_row(row, target, hbm))
            if no_decode is not None:
                add(ProgramReport("kernel decode_attention", target.name, False, 0.0, hbm,
                                  error_name=NOT_APPLICABLE, applicable=False,
                                  error=no_decode))
            continue
        if name in missing:
            add(ProgramReport(name, target.name, False, 0.0, hbm, error_name=NOT_APPLICABLE,
                              error=missing[name], applicable=False))
            continue
        for built in built_programs(name, run, task, mesh, search):
            add(from_built(built, target, hbm))
    return out


def built_programs(name: str, run: RunConfig, task: BoundTask, mesh,
                   search: build_lib.SearchSettings | None = None) -> list[build_lib.Built]:
    """`vpo.accel.build.build` of `name`; an environment run's RL step is its episode
    programs and update (`vpo.accel.env_build.build_env_step`)."""
    if name == "rl_step":
        return for_kind(KIND_PLANS, task).rl_step(run, task, mesh)
    return build_lib.build(name, run, task, mesh, search)
