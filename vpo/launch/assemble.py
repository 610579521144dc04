"""The one assembly of a run from a command's parts, and the task as a policy reads it.

`load_task` binds a built-in or dataset task to the tokenizer of the policy that will read it
(the checkpoint's own, or the task's word-level one for a model preset trained from scratch):
every entry point (train, sft, sample, eval, search, compare) reads its task through it.
"""

from __future__ import annotations

import os

from vpo.config import MODEL_PRESETS
from vpo.errors import CheckpointError
from vpo.io import hf
from vpo.io.checkpoint import NO_POLICY, resolve_model_spec
from vpo.io.tokenizer import load_tokenizer
from vpo.tasks import make_task
from vpo.tasks.bound import bind
from vpo.tasks.words import task_word_tokenizer


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


def load_task(name: str, model_spec: str | None = None, task_kwargs: dict | None = None):
    """The built-in task `name` bound to the tokenizer of `model_spec` (`tokenizer_for`): what
    every entry point (CLI, compare, eval, search) reads a task through."""
    task = make_task(name, **(task_kwargs or {}))
    return bind(task, tokenizer_for(task, model_spec))
