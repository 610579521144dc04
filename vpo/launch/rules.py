"""The rules every entry point shares, each in one place (`vpo train`, `vpo sft`, `vpo compare`,
`vpo sample / eval / search` and the Python API call them):

    the task, bound to the tokenizer of the policy that reads it                `load_task`
    the sequence length: the longest measured prompt + answers + `SEQ_MARGIN`    `fit_seq_len`
    the generation budget of every command (train, sample, eval, search)  `completion_budget`
    the budget against a checkpoint's context, and what helps when it does not fit
                                                                 `fit_budget` (`rl.checks.too_long`)
    the learning rate of a run that sets none (`FROM_SCRATCH_LR`, `PRETRAINED_LR`) `learning_rate`
    the packed update's rows of a run that sets none (`PACK_MIN_BUDGET`)             `pack_rows`
    the pretrained weights a policy comes from, and their context    `source_of`, `context_of`
    the refusal of a model preset where text needs a checkpoint's tokenizer `checkpoint_needed`
    a policy's fit to a task: its m, vocabulary and words                          `check_fit`
"""

from __future__ import annotations

import json
import os

from vpo.config import MODEL_PRESETS, PRESETS_DOC, PRETRAINED_CHOICES, TrainConfig
from vpo.errors import CheckpointError, ConfigError
from vpo.io import hf
from vpo.io.policy_folder import NO_POLICY, resolve_model_spec
from vpo.io.tokenizer import load_tokenizer
from vpo.rl.checks import too_long
from vpo.run import run_folder
from vpo.tasks import make_task
from vpo.tasks.bound import BoundTask, HostTask, bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer

# Positions beyond the longest measured prompt + answers (problems longer than the measured ones).
SEQ_MARGIN = 64


# The learning rates of a run that sets none, the one table. A model preset trained from random
# weights: RL at `TrainConfig.learning_rate`'s default, SFT at 3e-3. A run from a pretrained
# checkpoint: those rates wreck it (SmolLM2 SFT at 3e-3: loss 1.11 -> 1.74 in 6 steps), so full
# fine-tuning takes TRL's defaults (GRPOConfig 1e-6, SFTConfig 2e-5) and LoRA adapters, which
# start at B = 0, 1e-4 for both.
FROM_SCRATCH_LR = {"rl": TrainConfig.learning_rate, "sft": 3e-3}
PRETRAINED_LR = {"rl": 1e-6, "sft": 2e-5, "lora": 1e-4}


def tokenizer_for(task, model_spec: str | None = None):
    """The tokenizer a policy reads `task` with: the checkpoint's own (`hf:/path` to a folder
    or a .gguf file, or a policy folder), or, for a model preset trained from scratch (None or a
    preset name), the task's word-level tokenizer (`vpo.tasks.words.task_word_tokenizer`).
    Anything else is a `CheckpointError` (a mistyped path must not fall back to words)."""
    model_spec = model_spec and resolve_model_spec(model_spec)
    if model_spec and not (hf.is_hf_spec(model_spec) or os.path.isdir(model_spec)
                           or model_spec in MODEL_PRESETS):
        raise CheckpointError(NO_POLICY.format(spec=model_spec))
    if model_spec and hf.is_hf_spec(model_spec):
        return load_tokenizer(hf.hf_spec_path(model_spec))
    if model_spec and os.path.isdir(model_spec):
        return load_tokenizer(model_spec)
    return task_word_tokenizer(task)


def task_flag(name: str) -> str:
    """The flag that makes task `name` (a config's `task`) from a user's text: --env for an
    environment, --data for a dataset."""
    return "--env" if name == "env" else "--data"


def task_named(name: str, task_kwargs: dict | None = None):
    """The task `name`: a built-in one (`vpo.tasks.make_task`), or "env", an environment
    (`vpo.env.task.make_env_task`, task_kwargs {"env": "MODULE:FACTORY", ...})."""
    if name == "env":
        from vpo.env.task import make_env_task

        try:
            return make_env_task(**(task_kwargs or {}))
        except TypeError as e:
            raise ConfigError(f"task_kwargs for 'env': {e}") from None
    return make_task(name, **(task_kwargs or {}))


def load_task(name: str, model_spec: str | None = None, task_kwargs: dict | None = None):
    """The task `name` (`task_named`) bound to the tokenizer of `model_spec` (`tokenizer_for`)."""
    task = task_named(name, task_kwargs)
    return bind(task, tokenizer_for(task, model_spec))


def fit_seq_len(task: BoundTask, num_answers, *, num_parents: int = 0, seed: int = 0,
                num_problems: int = 64, at_least: int = 0, records=None,
                max_new_tokens: int | None = None) -> int:
    """max(at_least, longest prompt + answer budget over `records` (default: `num_problems`
    problems of `seed`), for each m in `num_answers` (an int or several), mutation prompts with
    `num_parents` parents included, + `SEQ_MARGIN`). `at_least` is the model's own length (a
    preset's default or a checkpoint's context), which the fit only raises; `max_new_tokens`
    replaces the task's answer budget (host-scored tasks)."""
    ms = [num_answers] if isinstance(num_answers, int) else list(num_answers)
    records = task.make_problems(seed, num_problems) if records is None else records
    need = max(seq_len_for(task, records, m, num_parents=num_parents) for m in ms)
    if max_new_tokens is not None:
        need = max(need, max(task.prompt_arrays(records, m)[0].shape[1] for m in ms)
                   + max_new_tokens)
    return max(at_least, need + SEQ_MARGIN)


def completion_budget(task: BoundTask, num_answers: int, *, policy: str | None = None,
                      given: int | None = None) -> int:
    """The generation budget (new tokens per completion) every command uses by default.

    In-graph tasks: the task's answer budget `task.completion_len(m)` (their reader is built for
    it). Host-scored tasks (your data, arithmetic): `given` (--max-new-tokens) if set; else, for
    a `vpo train` run's policy, the run's own `sampler.max_new_tokens` (its policy.json's
    `max_new_tokens`, or the run folder's config.json), at least the task's answer budget; else
    the task's answer budget, which for free-text answers (a dataset: no fixed words) is at least
    `vpo.tasks.dataset.ANSWER_TOKENS` per answer."""
    from vpo.tasks.dataset import ANSWER_TOKENS

    floor = task.completion_len(num_answers)
    if not isinstance(task, HostTask):  # the reader is built for the answer budget
        return floor
    if given is not None:
        return int(given)

    def read(path, *keys):
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
        except (OSError, ValueError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    trained = None
    spec = resolve_model_spec(policy) if policy and policy not in MODEL_PRESETS else None
    if spec and not hf.is_hf_spec(spec) and os.path.isdir(spec):
        trained = read(os.path.join(spec, "policy.json"), "max_new_tokens")
        if trained is None and os.path.basename(os.path.normpath(spec)) == "policy":
            run_dir = os.path.dirname(os.path.abspath(spec))  # a vpo train --out folder
            trained = read(os.path.join(run_dir, run_folder.CONFIG), "sampler", "max_new_tokens")
    if trained is not None:
        return max(trained, floor)
    free_text = task.task.symbols is None and not task.task.words
    return max(floor, num_answers * ANSWER_TOKENS) if free_text else floor


def fit_budget(task: BoundTask, num_answers: int, prompt_len: int, need: int, budget: int, *,
               context: int | None, given: bool, spec: str | None = None,
               num_parents: int = 0) -> int:
    """The one rule for the generation budget against a checkpoint's positions, every task kind
    and entry point. A run needs `need` positions: its longest prompt (`prompt_len` tokens, the
    plain ones; a mutation prompt may need more) plus the `budget`. Within `context` (None: a
    model trained from scratch, whose length is fitted to the need instead) the budget stands.
    Past it, a host-scored task's budget the user left out (`given` False) is fitted down to
    what the longest prompt leaves, never below the task's answer budget
    (`task.completion_len`); an in-graph task's budget is that answer budget and stays.
    Anything that still does not fit is a ConfigError (`too_long`) naming what helps."""
    if context is None or need <= context:
        return budget
    room = context - prompt_len
    floor = task.completion_len(num_answers)
    if (isinstance(task, HostTask) and not given and room >= floor
            and need - budget + room <= context):
        return room
    raise ConfigError(too_long(task, num_answers, need, budget, context=context, spec=spec,
                               given=given, room=room, num_parents=num_parents))




# The packed update (`vpo.rl.packing`) pays where completions of ragged lengths leave the padded
# layout mostly padding: the log-prob + loss + gradient pass ran 1.73x faster packed on the
# tiny preset at T = 256 and 2.84x on the SmolLM2-135M shape at T = 128 (docs/performance.md,
# "Packed update"). Below this budget it is not measured, and in-graph tasks' answers fill
# their short budgets.
PACK_MIN_BUDGET = 128


def pack_rows(task: BoundTask, num_samples: int, max_new_tokens: int) -> int:
    """`train.pack_rows` R of a run that sets none: R = ⌊G/2⌋ for a host-scored task (free
    text of ragged lengths) with G ≥ 4 samples per prompt and a budget of at least
    `PACK_MIN_BUDGET` tokens, else 0 (padded). With R = ⌊G/2⌋ the pass runs over
    G + R·(T − 1) ≈ half the padded G·T positions whenever a prompt's completions fit R rows
    (on average under half the budget); a micro-batch that does not fit runs padded (the step's
    `lax.cond`), so no token is ever dropped, and `pack/packed` logs the share packed. An
    environment's episodes stay padded (their observations interleave the completion)."""
    from vpo.env.task import EnvTask

    free_text = isinstance(task, HostTask) and not isinstance(task, EnvTask)
    if free_text and num_samples >= 4 and max_new_tokens >= PACK_MIN_BUDGET:
        return num_samples // 2
    return 0


def checkpoint_needed(flag: str, preset: str | None, *, opt: str = "model=",
                      folder: str = "--init POLICY_DIR") -> ConfigError:
    """The refusal of `flag` (--data, --env) on model preset `preset` (random weights, the
    built-in tasks' word-level tokenizer): what the text needs and every way to give it. `opt`:
    how the command names a checkpoint (`model=`, `--model `, `--policy `); `folder`: how it
    names a vpo policy folder."""
    which = (f"{opt}{preset} is a model preset" if preset else "a model preset (the default)")
    twin = ("; smollm2-135m is SmolLM2-135M's shapes with random weights, the pretrained "
            "checkpoint is smollm2" if preset == "smollm2-135m" else "")
    lora = "; add model.lora_rank=8 to train LoRA adapters" if opt == "model=" else ""
    return ConfigError(
        f"{flag}: your text is read through a pretrained checkpoint's tokenizer, and {which}: "
        f"random weights that read only the built-in tasks{twin}; pass "
        f"{PRETRAINED_CHOICES.format(opt=opt)} or {folder} (a vpo sft / vpo train policy)"
        f"{lora}. The model presets and what each can do: {PRESETS_DOC}")


def source_of(model_spec: str | None) -> str | None:
    """The pretrained weights a policy comes from: `hf:PATH` for a checkpoint (smollm2 resolved),
    the `source` a policy folder records (an SFT or RL run of a checkpoint), None for a model
    trained from scratch."""
    if not model_spec or model_spec in MODEL_PRESETS:
        return None
    spec = resolve_model_spec(model_spec)
    if hf.is_hf_spec(spec):
        return spec
    path = os.path.join(spec, "policy.json")
    if os.path.exists(path):
        with open(path) as f:
            source = str(json.load(f).get("source") or "")
        return source if hf.is_hf_spec(source) else None
    return None


def learning_rate(kind: str, model_spec: str | None, lora_rank: int,
                  given: float | None = None) -> float:
    """The learning rate of an RL ("rl") or SFT ("sft") run: `given` if set (None: not given),
    else for a policy of pretrained weights (`source_of`) `PRETRAINED_LR` (LoRA: its "lora"
    rate), otherwise the from-scratch rate `FROM_SCRATCH_LR`."""
    if given is not None:
        return given
    if source_of(model_spec):
        return PRETRAINED_LR["lora"] if lora_rank else PRETRAINED_LR[kind]
    return FROM_SCRATCH_LR[kind]


def context_of(model_spec: str | None) -> int | None:
    """The positions a pretrained checkpoint was trained on (`max_position_embeddings`), for an
    hf: spec or a policy folder of one (`source_of`); None for a model trained from scratch."""
    source = source_of(model_spec)
    if source is None:
        return None
    return hf.model_config(hf.read_config(hf.hf_spec_path(source))).max_seq_len


def check_fit(model_cfg, task, problems, num_answers: int, source: str) -> None:
    """The policy can read and write `task` with `num_answers` answers: the task takes that m,
    its tokenizer fits the model's vocabulary, and its prompts hold no unknown words (a
    word-level policy asked about another task's text); else a ConfigError naming it."""
    import numpy as np

    task.check_num_answers(num_answers)
    if model_cfg.vocab_size < task.tokenizer.size:
        raise ConfigError(f"{source}: the model has {model_cfg.vocab_size} token embeddings "
                          f"but its tokenizer for {task.name} has {task.tokenizer.size} tokens; "
                          "use the policy with the tokenizer it was trained with")
    unk = task.tokenizer.special_tokens.get("unk_token")
    unk_id = task.tokenizer.backend.token_to_id(unk) if unk else None
    if unk_id is not None and task.writes_own_prompts:  # an environment's is what it writes
        tokens, mask = task.prompt_arrays(problems, num_answers)
        if np.any(np.asarray(tokens)[np.asarray(mask)] == unk_id):
            raise ConfigError(f"--task {task.name}: the tokenizer of {source} cannot write "
                              f"{task.name} prompts (they hold words outside its "
                              f"{task.tokenizer.size}-token vocabulary); pass the task the "
                              "policy was trained on, or a policy trained on this task")
