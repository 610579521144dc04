"""A `vpo train` run made ready in its folder: `start_new` (a new run in --out) and
`start_resume` (the run in --out continued). Each returns a `Ready` run: its config, its bound
task and the policy it starts from, with --out locked and, for a new run, cleared (`--overwrite`)
and its starting policy recorded (`vpo.run.run_folder.write_init`). The caller then hands it to
`vpo.run.loop.train`; nothing here trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vpo.config import ConfigError, RunConfig
from vpo.io.policy_folder import load_model
from vpo.launch import assemble
from vpo.rl.host_memory import keep_freed_memory_for
from vpo.run import run_folder
from vpo.tasks.bound import BoundTask


@dataclasses.dataclass(frozen=True)
class Ready:
    """A run ready for `vpo.run.loop.train`: config, task, the starting policy (a Decoder, or
    None for a random init) and what loading it said (`info`: the policy folder's record)."""

    run: RunConfig
    task: BoundTask
    init: Any
    init_spec: str | None
    info: dict


def start_new(out_dir: str, *, preset: str | None = None, config_file: str | None = None,
              overrides=(), init: str | None = None, dataset: dict | None = None,
              overwrite: bool = False) -> Ready:
    """A new run in `out_dir`: the folder checked and locked first (`check_new_run`: a folder
    holding a run needs `overwrite`), the run assembled (`assemble.assemble_run`), the host
    allocator set for the model's size, its starting policy loaded (`assemble.load_init`), then
    the folder cleared when `overwrite` and the starting policy recorded. A config error leaves
    the folder as it was."""
    run_folder.check_new_run(out_dir, overwrite=overwrite)
    plan = assemble.assemble_run(preset, config_file, overrides, init=init, dataset=dataset)
    keep_freed_memory_for(plan.run.model.num_params)  # before jax starts its threads
    model, run, info = None, plan.run, {}
    if plan.init_spec:
        model, run, info = assemble.load_init(plan, config_file)
    if overwrite:
        run_folder.clear_run(out_dir)
    if plan.init_spec:
        run_folder.write_init(out_dir, plan.init_spec)
    return Ready(run, plan.task, model, plan.init_spec, info)


def start_resume(out_dir: str, *, preset: str | None = None, config_file: str | None = None,
                 overrides=(), init: str | None = None, dataset: dict | None = None,
                 overwrite: bool = False, data_changed_ok: bool = False,
                 flags: tuple[str, ...] = (), reward_flags: dict[str, Any] | None = None
                 ) -> Ready:
    """The run in `out_dir` continued (`assemble.assemble_resume`). The command that started it
    may be repeated with --resume (`preset`, `config_file`, `init`, `dataset`; `flags` names
    the command's flags that gave them): accepted when it builds the recorded run, a difference
    refused by name (`assemble.resume_differences`).
    `reward_flags`: reward options given without --data ({"--reward-workers": 4}), refused
    (the run keeps the reward settings it started with). `overwrite` contradicts resuming."""
    if overwrite:
        raise ConfigError("--overwrite: not with --resume (--resume continues the run in "
                          f"{out_dir}, --overwrite replaces it); choose one")
    for flag, given in (reward_flags or {}).items():
        if given and dataset is None:
            raise ConfigError(f"{flag}: not with --resume alone (the run in {out_dir} keeps "
                              "the reward settings it started with); re-run the whole command "
                              "that started it with --resume added, or drop it")
    chosen = list(flags) or [flag for flag, given in (
        ("--preset", preset), ("--config", config_file), ("--init", init), ("--data", dataset))
        if given]
    if chosen:
        differ = assemble.resume_differences(out_dir, preset, config_file, overrides,
                                             init=init, dataset=dataset)
        if differ:
            raise ConfigError(f"{', '.join(chosen)} with --resume: the run in {out_dir} was "
                              f"started with other settings ({', '.join(differ)} differ); "
                              "resume it with the command that started it (or with --resume "
                              "alone), or start a new run with another --out")
        # the command's other overrides build the recorded run (checked just above)
        overrides = [o for o in overrides if o.partition("=")[0] in run_folder.RESUME_SAFE]
    plan = assemble.assemble_resume(out_dir, overrides, data_changed_ok=data_changed_ok)
    keep_freed_memory_for(plan.run.model.num_params)  # before jax starts its threads
    model = None
    if plan.init_spec:  # the run's own model settings (dtype, rope, ...), not the file's
        model, _, _ = load_model(plan.init_spec, **assemble.loadable_fields(plan.run.model))
    return Ready(plan.run, plan.task, model, plan.init_spec, {})
