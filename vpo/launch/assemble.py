"""The one assembly of a run from a command's parts: `assemble_run` (then `load_init`) for
`vpo train`, `assemble_resume` for `vpo train --resume`, `resume_differences` for a start command
re-run with --resume. The RunConfig is built from a preset or file, overrides, model= / --init and
--data, fitted to the task (`vpo.launch.rules`) and checked once; nothing is allocated."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from vpo.config import (
    MODEL_PRESETS,
    PRETRAINED_CHOICES,
    ConfigError,
    ObjectiveConfig,
    RunConfig,
    apply_overrides,
    from_dict,
    model_preset,
    preset_list,
)
from vpo.io import hf
from vpo.io.policy_folder import SHAPE_FIELDS, load_model, resolve_model_spec
from vpo.io.tokenizer import load_tokenizer
from vpo.launch import rules
from vpo.launch.presets import PRESET_DATA, TRAIN_PRESETS, preset_dataset
from vpo.model import lora
from vpo.run import run_folder
from vpo.tasks import TASK_NAMES
from vpo.tasks.bound import BoundTask, HostTask, bind

# -- vpo train ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Assembly:
    """A run ready to start: its config (fitted and checked), its bound task, the policy it
    starts from (`init_spec`, None for a model preset), and what the user set (`given`:
    `section.key` names; `model_fields`: the model fields a --config file sets)."""

    run: RunConfig
    task: BoundTask
    init_spec: str | None
    given: frozenset[str] = frozenset()
    model_fields: frozenset[str] = frozenset()
    overrides: tuple[str, ...] = ()


def split_overrides(overrides) -> list[tuple[str, str]]:
    """`section.key=value` strings as (key, value) pairs, split once (the value keeps any `=`)."""
    return [(item.partition("=")[0], item.partition("=")[2]) for item in overrides]


def assemble_run(preset: str | None = None, config_file: str | None = None,
                 overrides: list[str] | tuple[str, ...] = (), *, init: str | None = None,
                 dataset: dict | None = None) -> Assembly:
    """The RunConfig of `vpo train` from a preset or a JSON file, then `section.key=value`
    overrides (the strings of a command line, parsed here once), then `assemble_config`: fitted
    to the task read through the policy's tokenizer (`init`, or `model=hf:PATH`, or the task's
    word-level one for a preset model). `dataset` (from `--data`) makes the task a user's data
    and reward functions. Nothing is allocated."""
    overrides = list(overrides)
    run, file_data = RunConfig(), {}
    init_spec = None
    user_data = dataset is not None  # --data (a preset's own data is added below)
    if config_file:
        run, file_data = read_config_file(config_file)
    base: list[str] = []
    if preset:
        if preset not in TRAIN_PRESETS:
            raise ConfigError(f"--preset: unknown preset {preset!r}; choose one of "
                              f"{', '.join(TRAIN_PRESETS)}")
        task_name, base = TRAIN_PRESETS[preset]
        if run.task_kwargs and run.task != task_name:
            raise ConfigError(f"--preset {preset}: its task {task_name!r} replaces the config "
                              f"file's task {run.task!r} and its task_kwargs; drop --preset or "
                              "the file's task_kwargs")
        if config_file:
            raise ConfigError(f"--preset {preset} and --config {config_file}: choose one (the "
                              "preset's settings would overwrite the file's); put the settings "
                              "you want in the file, or pass them as overrides")
        run = dataclasses.replace(run, task=task_name)
        if preset in PRESET_DATA and dataset is None:
            dataset = preset_dataset(preset)
    if user_data and "task" in file_data:
        raise ConfigError(f"--data: the --config file {config_file} names its own task; "
                          "your data would replace it. Drop --data or the file's task")
    given_pairs, base_pairs = split_overrides(overrides), split_overrides(base)
    rest = []
    for (key, value), item in zip(base_pairs + given_pairs, base + overrides, strict=True):
        if (key, value) in given_pairs and key in ("model", "task"):
            other = {"model": init and f"--init {init}", "task": user_data and "--data"}[key]
            if other:
                raise ConfigError(f"{key}={value}: {other} fixes the {key}; drop one of them")
        if key == "model":
            run, spec = _with_model(run, value)
            init_spec = spec or init_spec
        elif key == "task":
            run = _with_task(run, value)
        else:
            rest.append(item)
    run = apply_overrides(run, rest)
    given = {key for key, _ in given_pairs}
    given |= {f"{section}.{key}" for section, fields in file_data.items()
              if isinstance(fields, dict) for key in fields}
    if dataset is not None:  # --data, or --env (its task_kwargs name the environment)
        run = dataclasses.replace(run, task="env" if "env" in dataset else "dataset",
                                  task_kwargs=dataset)
    init_spec = init or init_spec
    if run.task in ("dataset", "env") and init_spec is None:
        preset = next((v for k, v in reversed(base_pairs + given_pairs) if k == "model"), None)
        raise rules.checkpoint_needed(rules.task_flag(run.task), preset)
    model_fields = frozenset(file_data.get("model", {})) if "model" not in given else frozenset()
    plan = assemble_config(run, frozenset(given), init_spec=init_spec,
                           chosen=frozenset(given | {key for key, _ in base_pairs}))
    return dataclasses.replace(plan, model_fields=model_fields,
                               overrides=tuple(base + overrides))


def assemble_config(run: RunConfig, given: frozenset[str], *, init_spec: str | None,
                    task: BoundTask | None = None, chosen: frozenset[str] | None = None
                    ) -> Assembly:
    """A typed RunConfig made ready to start, the typed half of `assemble_run` (`vpo compare`
    calls it for every arm with the task it assembled once). `given`: the `section.key` fields
    the user set (a floor below the task's need is refused; the rest is fitted); `chosen`:
    `given` plus what a preset set (default `given`), whose learning rate and generation budget
    no rule replaces. Rules applied: the learning rate (`rules.learning_rate`), the generation
    budget of host-scored tasks (`rules.completion_budget`), vocabulary / sequence length /
    answer budget fitted to the task and the checkpoint's context, the packed update's rows
    (`rules.pack_rows`). `task`: the task already bound to the policy's tokenizer (default:
    `rules.load_task` reads it)."""
    chosen = given if chosen is None else chosen
    _refuse_unread_objective_fields(run, given)
    if "train.learning_rate" not in chosen:
        run = dataclasses.replace(run, train=dataclasses.replace(
            run.train, learning_rate=rules.learning_rate("rl", init_spec, run.model.lora_rank)))
    if task is None:
        task = rules.load_task(run.task, init_spec, run.task_kwargs)
    budget = (None if "sampler.max_new_tokens" in chosen or not isinstance(task, HostTask)
              else rules.completion_budget(task, run.train.num_answers, policy=init_spec))
    run = _fit_to_task(run, task, set(given), context=rules.context_of(init_spec),
                       spec=init_spec, budget=budget)
    if "train.pack_rows" not in chosen:  # an environment's episodes stay padded (rules)
        rows = rules.pack_rows(task, run.sampler.num_samples, run.sampler.max_new_tokens)
        run = dataclasses.replace(run, train=dataclasses.replace(run.train, pack_rows=rows))
    return Assembly(run, task, init_spec, frozenset(given))


def _with_model(run: RunConfig, value: str) -> tuple[RunConfig, str | None]:
    """`model=VALUE`: a preset's shapes, or a checkpoint's config (returned as the init spec)."""
    value = resolve_model_spec(value)  # smollm2 → hf:<the package's GGUF>
    if value.startswith("hf:"):
        return dataclasses.replace(
            run, model=hf.model_config(hf.read_config(hf.hf_spec_path(value)))), value
    if value not in MODEL_PRESETS:
        hint = (f"; to start from the vpo policy there pass --init {value}"
                if os.path.isdir(value) else "")
        raise ConfigError(f"model={value}: not a model; give a preset ({preset_list()}: "
                          f"random weights, built-in tasks), or a pretrained checkpoint: "
                          f"{PRETRAINED_CHOICES.format(opt='model=')}{hint}")
    return dataclasses.replace(run, model=model_preset(value)), None


def _with_task(run: RunConfig, value: str) -> RunConfig:
    if value not in TASK_NAMES:
        raise ConfigError(f"task: unknown task {value!r}; choose one of {', '.join(TASK_NAMES)}")
    if run.task_kwargs and value != run.task:
        raise ConfigError(f"task={value}: the config's task_kwargs "
                          f"{json.dumps(run.task_kwargs)[:80]} are for task {run.task!r}; "
                          "remove them from the config file to change the task")
    return dataclasses.replace(run, task=value)


def _fit_to_task(run: RunConfig, task: BoundTask, given: set[str], *,
                 context: int | None = None, spec: str | None = None,
                 budget: int | None = None) -> RunConfig:
    """Vocabulary, sequence length and answer budget raised to what the task needs, where the
    user did not set them; a value the user set below that is refused, naming the floor.
    `budget`: the default generation budget (`rules.completion_budget`) replacing the config's. A
    pretrained checkpoint's `context` bounds the sequence length (`rules.fit_budget`, the one
    rule): a default budget is fitted to what the longest prompt leaves, and a run that still
    does not fit is refused before anything is allocated, naming what helps."""
    m = run.train.num_answers
    T = task.completion_len(m)
    parents = run.train.mutation_parents if run.train.mutation_fraction > 0 else 0
    records = task.make_problems(run.train.seed, 64)
    seq = rules.fit_seq_len(task, m, num_parents=parents, records=records,
                            max_new_tokens=budget)
    if context is not None:  # the one rule (`rules.fit_budget`): fitted within it, or refused
        tokens = budget if budget is not None else (
            run.sampler.max_new_tokens
            if "sampler.max_new_tokens" in given and isinstance(task, HostTask)
            else T)
        prompt_len = task.prompt_arrays(records, m)[0].shape[1]
        need = max(seq - rules.SEQ_MARGIN, prompt_len + tokens)
        fitted = rules.fit_budget(task, m, prompt_len, need, tokens, context=context,
                                  given=budget is None, spec=spec, num_parents=parents)
        if fitted != tokens:
            budget = fitted
            seq = rules.fit_seq_len(task, m, num_parents=parents, records=records,
                                    max_new_tokens=budget)
        seq = min(seq, context)
    if budget is not None:
        run = dataclasses.replace(run, sampler=dataclasses.replace(run.sampler,
                                                                   max_new_tokens=budget))
    floors = {"model.vocab_size": (task.tokenizer.size, "the tokenizer's vocabulary"),
              "model.max_seq_len": (seq - rules.SEQ_MARGIN,
                                    "the longest prompt plus the answer budget"),
              "sampler.max_new_tokens": (T, "the task's answer budget" + (
                  f" for m={m} answers in tags" if m > 1 else ""))}
    for key, (floor, what) in floors.items():
        section, field = key.split(".")
        value = getattr(getattr(run, section), field)
        if key in given and value < floor:
            raise ConfigError(f"{key}={value} is below {what} ({floor}); raise it to at least "
                              f"{floor} (on the command line or in the --config file) or leave "
                              "it out to have it fitted")
    fit = lambda key, value, floor: value if key in given else max(value, floor)  # noqa: E731
    return dataclasses.replace(
        run, model=dataclasses.replace(
            run.model, vocab_size=fit("model.vocab_size", run.model.vocab_size,
                                      task.tokenizer.size),
            max_seq_len=fit("model.max_seq_len", run.model.max_seq_len, seq)),
        sampler=dataclasses.replace(run.sampler, max_new_tokens=fit(
            "sampler.max_new_tokens", run.sampler.max_new_tokens, T)))


def _refuse_unread_objective_fields(run: RunConfig, given: set[str]) -> None:
    """A given estimator-specific objective field (e.g. `objective.grpo_scale`) that the chosen
    `objective.advantage` does not read, set to other than its default, is an error: it would
    change nothing. (`vpo compare` shares one objective section among its arms and checks its
    own overrides: its arms pass the shared fields through here too.)"""
    from vpo.objectives.estimators import ESTIMATOR_FIELDS, ESTIMATORS  # jax: on first use

    advantage = run.objective.advantage
    reads = ESTIMATORS[advantage].reads
    default = ObjectiveConfig()
    for field in sorted(ESTIMATOR_FIELDS - reads):
        value = getattr(run.objective, field)
        if f"objective.{field}" in given and value != getattr(default, field):
            users = ", ".join(n for n, e in ESTIMATORS.items() if field in e.reads)
            raise ConfigError(
                f"objective.{field}={value}: objective.advantage={advantage} does not read it "
                f"(it reads {', '.join(sorted(reads)) or 'no estimator-specific field'}); remove "
                f"it, or choose an advantage that uses it ({users})")


def read_config_file(path: str) -> tuple[RunConfig, dict[str, Any]]:
    """(RunConfig, the JSON object as written) of a --config file, read once; unreadable JSON
    names file:line."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config {path}:{e.lineno}: not valid JSON ({e.msg}); a RunConfig "
                          "is one JSON object, e.g. a run's config.json") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not UTF-8 text; save it as UTF-8 JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a JSON object (a RunConfig), got "
                          f"{type(data).__name__}")
    for section in ("model", "sampler", "objective", "train"):
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"--config {path}: `{section}` must be an object of "
                              f"{section}.* fields; got {type(data[section]).__name__}")
    if not isinstance(data.get("task_kwargs", {}), dict):
        raise ConfigError(f"--config {path}: task_kwargs must be an object of the task's "
                          f"keyword arguments; got {type(data['task_kwargs']).__name__}")
    return from_dict(RunConfig, data), data


def load_init(plan: Assembly, config_file: str | None = None, *, policy=None):
    """(Decoder, run with the checkpoint's model config, info) of `plan.init_spec`. `model.*`
    settings the user gave (overrides, or a --config file's model fields) are applied to the
    loaded model (dtype, rope, norm eps) or kept (LoRA), or refused by name (shapes the
    checkpoint fixes); a --config file's shape field must equal the checkpoint's. `policy`: that
    policy already in memory (a Decoder; `vpo compare`'s warm start), used instead of reading
    `plan.init_spec` again (info is then {})."""
    spec, run = plan.init_spec, plan.run
    keys = {key.split(".", 1)[1] for key, _ in split_overrides(plan.overrides)
            if key.startswith("model.")}
    lora_keys = set(lora.settings(run.model))
    fixed = sorted((keys & set(SHAPE_FIELDS)) - lora_keys)
    if fixed:
        raise ConfigError(f"model.{fixed[0]}: the checkpoint {spec} fixes it (its parameters "
                          "have that shape); drop the override, or train a preset model "
                          "(model=tiny|small) from scratch instead")
    extra = {k: getattr(run.model, k) for k in (keys | plan.model_fields) - set(SHAPE_FIELDS)
             - lora_keys - {"max_seq_len"}}
    if policy is None:
        init, _, info = load_model(spec, max_seq_len=run.model.max_seq_len, **extra)
    else:
        if extra:
            raise ConfigError(f"model.{sorted(extra)[0]}: a policy in memory is used as it is; "
                              "load it with that setting instead")
        init, info = policy, {}
    for k in sorted((plan.model_fields & set(SHAPE_FIELDS)) - lora_keys):
        if getattr(run.model, k) != getattr(init.cfg, k):
            raise ConfigError(f"model.{k}: the --config file {config_file} has "
                              f"{getattr(run.model, k)!r}, the checkpoint {spec} "
                              f"{getattr(init.cfg, k)!r} (its parameters fix it); remove "
                              f"model.{k} from the file")
    model = dataclasses.replace(init.cfg, max_seq_len=run.model.max_seq_len,
                                **lora.settings(run.model))
    if model != run.model:
        run = dataclasses.replace(run, model=model)
    return init, run, info


def loadable_fields(model_cfg) -> dict:
    """The ModelConfig fields a checkpoint can be loaded with (not its shapes, not LoRA)."""
    return {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg)
            if f.name not in SHAPE_FIELDS}


def resume_differences(out_dir: str, preset: str | None, config_file: str | None,
                       overrides=(), *, init: str | None = None,
                       dataset: dict | None = None) -> list[str]:
    """The `section.key` names where the run a command would start differs from the run recorded
    in `out_dir` (what `--resume` continues), the overrides `--resume` applies
    (`run_folder.RESUME_SAFE`) left out; the model section is compared only when no checkpoint
    is loaded (a checkpoint's shapes are read from its weights). `--init` must name the recorded
    starting policy."""
    fresh = assemble_run(preset, config_file, overrides, init=init, dataset=dataset)
    recorded = run_folder.read_run_config(out_dir)
    skip = {key for key in (item.partition("=")[0] for item in overrides)
            if key in run_folder.RESUME_SAFE}
    flat = lambda run: {f"{section}.{key}": value  # noqa: E731
                        for section, fields in dataclasses.asdict(run).items()
                        for key, value in (fields.items() if isinstance(fields, dict)
                                           else [("", fields)])}
    a, b = flat(fresh.run), flat(recorded)
    differ = sorted(k.rstrip(".") for k in a.keys() | b.keys()
                    if a.get(k) != b.get(k) and k.rstrip(".") not in skip
                    and not (fresh.init_spec and k.startswith("model.")))
    if fresh.init_spec:
        recorded_init = run_folder.read_init(out_dir)
        if recorded_init != run_folder.init_spec_of(fresh.init_spec):
            differ.append(f"init ({recorded_init} recorded)")
    return differ


def assemble_resume(out_dir: str, overrides: list[str] | tuple[str, ...] = (), *,
                    data_changed_ok: bool = False) -> Assembly:
    """The run in `out_dir` as it was started (`vpo.run.run_folder.resume_config`: only
    overrides that keep it the same run), its task through its own tokenizer, and its starting
    policy when it was killed before its first checkpoint, or always for a LoRA run (its
    checkpoints hold the adapters, not the base). `data_changed_ok`: a --data file that
    changed since the run started is accepted (its new hash recorded) instead of refused."""
    run = run_folder.resume_config(out_dir, list(overrides), data_changed_ok=data_changed_ok)
    task = bind(rules.task_named(run.task, run.task_kwargs), load_tokenizer(out_dir))
    init_spec = None
    if run.model.lora_rank or not run_folder.has_checkpoint(out_dir):
        init_spec = run_folder.read_init(out_dir)
    return Assembly(run, task, init_spec, overrides=tuple(overrides))
