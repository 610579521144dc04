"""A run checked against its task and its devices before anything is allocated: answer count,
vocabulary, answer budget, sequence length, mutation prompts, group size, and the lower-bound
memory (`RunConfig.memory_bytes`) against what the devices have."""

from __future__ import annotations

import os

import jax

from vpo.config import ConfigError, RunConfig, check_memory
from vpo.kernels import hardware
from vpo.kernels import logprob_entropy as logprob_lib
from vpo.tasks.bound import BoundTask, HostTask


def device_memory() -> tuple[int, str]:
    """(bytes, description) of the memory the run's devices have together: the sum of the
    accelerators' `bytes_limit`, or the host's physical memory for CPU devices (which share it)."""
    devices = jax.local_devices()
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
    if all(limits):
        total = sum(limits) * jax.process_count()
        return total, f"{len(devices) * jax.process_count()} {devices[0].platform} device(s)"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host's memory"


def check_run(run: RunConfig, task: BoundTask, prompt_len: int, *, mesh=None) -> None:
    """Cross-field checks between the run config, its task (whose longest prompt, mutation
    prompts included, has `prompt_len` tokens) and the devices (`mesh`, else this process's),
    with the fix in the message; then the size check: a run whose lower-bound memory
    (`RunConfig.memory_bytes`) exceeds the devices' is rejected before anything is allocated."""
    platform = hardware.platform_of(jax.devices()[:1] if mesh is None else mesh)
    if run.train.logprob_impl == "pallas" and not logprob_lib.supported(platform):
        raise ConfigError(f"train.logprob_impl: 'pallas' runs on GPU or TPU, not on "
                          f"{platform}; use 'chunked'")
    task.check_num_answers(run.train.num_answers)
    if run.train.off_policy_steps and isinstance(task, HostTask):
        raise ConfigError(f"train.off_policy_steps: task {task.name!r} scores its rollouts on "
                          "the host (or runs episodes there), which the overlapped step cannot "
                          "take into its one program; set train.off_policy_steps=0")
    task.check_run(run)  # what its kind adds (an environment: its sets of episodes)
    if run.model.vocab_size < task.tokenizer.size:
        raise ConfigError(f"model.vocab_size: {run.model.vocab_size} is smaller than the "
                          f"tokenizer's {task.tokenizer.size} tokens; raise it or use the "
                          "checkpoint's own tokenizer")
    need = task.completion_len(run.train.num_answers)
    if run.sampler.max_new_tokens < need:
        raise ConfigError(f"sampler.max_new_tokens: {run.sampler.max_new_tokens} < {need}, the "
                          f"{task.name} budget for {run.train.num_answers} answers; raise it")
    if run.train.mutation_fraction > 0 and not task.has_mutation_demonstrations:
        raise ConfigError(f"train.mutation_fraction: task {task.name!r} has no in-graph "
                          "mutation prompts; set train.mutation_fraction=0")
    if prompt_len + run.sampler.max_new_tokens > run.model.max_seq_len:

        parents = run.train.mutation_parents if run.train.mutation_fraction > 0 else 0
        raise ConfigError(too_long(task, run.train.num_answers,
                                   prompt_len + run.sampler.max_new_tokens,
                                   run.sampler.max_new_tokens, max_seq_len=run.model.max_seq_len,
                                   num_parents=parents))
    max_len = run.objective.overlong_max_len or run.sampler.max_new_tokens
    if run.objective.overlong_cache_len > max_len:
        raise ConfigError(f"objective.overlong_cache_len: {run.objective.overlong_cache_len} "
                          f"exceeds L_max = {max_len} tokens; make it smaller")
    if run.sampler.num_samples < 2:
        raise ConfigError("sampler.num_samples: group baselines need G >= 2 samples per prompt")
    check_memory(run, prompt_len, *device_memory())


def too_long(task: BoundTask, num_answers: int, need: int, budget: int, *,
             context: int | None = None, spec: str | None = None, max_seq_len: int | None = None,
             given: bool = True, room: int | None = None, num_parents: int = 0) -> str:
    """The one message of a run whose longest prompt plus generation budget (`need` positions)
    do not fit: a checkpoint's `context`, or a from-scratch model's `max_seq_len`. What it
    advises helps that task kind: shorter prompts and a lower sampler.max_new_tokens for a
    host-scored task (its budget is a setting), fewer answers, no mutation prompts or
    smaller problems for an in-graph task (its budget is the task's answer budget); a longer
    context for a checkpoint, model.max_seq_len only for a model trained from scratch."""
    floor = task.completion_len(num_answers)
    host = isinstance(task, HostTask)  # its budget is a setting, not the task's answer budget
    if context is not None:
        text = (f"the longest prompt ({need - budget} tokens) plus the answer budget ({budget} "
                f"tokens) need {need} positions; the checkpoint {spec} was trained on {context}")
        if host and not given and room is not None:
            text += (f", and what the longest prompt leaves ({max(room, 0)}) is below the task's "
                     f"answer budget ({floor} tokens): no budget fits")
    else:
        text = (f"model.max_seq_len: {max_seq_len} < {need}, the longest prompt ({need - budget} "
                f"tokens) plus the answer budget ({budget} tokens)")
    fixes = []
    if host:
        fixes.append("shorten the longest prompts")
        if given and room is not None and room >= floor:
            fixes.append(f"lower sampler.max_new_tokens to at most {room} (or leave it out to "
                         "have it fitted)")
        elif given and budget > floor:
            fixes.append("lower sampler.max_new_tokens")
    if num_answers > 1:
        fixes.append(f"lower train.num_answers (now {num_answers})")
    if not host:
        if num_parents:
            fixes.append("set train.mutation_fraction=0 (mutation prompts are the longer)")
        fixes.append("give the task smaller problems (task_kwargs)")
    if context is not None:
        fixes.append("start from a checkpoint with a longer context")
    else:
        fixes.append(f"raise model.max_seq_len to at least {need} (or leave it out to have it "
                     "fitted)")
    return f"{text}. To fit: {'; or '.join(fixes)}"
