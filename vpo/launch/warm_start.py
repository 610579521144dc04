"""The SFT warm start, assembled once for `vpo sft` and for `vpo compare`'s warm start:
`assemble_sft` (the model to fine-tune or train from scratch, its sequence length and learning
rate), `run_warm_start` (`vpo.rl.sft.run_sft` on it) and `save_warm_start` (its policy folder).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from flax import nnx

from vpo.config import MODEL_PRESETS, ConfigError, ModelConfig, model_preset
from vpo.io import policy_folder
from vpo.launch import rules
from vpo.rl.sft import run_sft
from vpo.rl.step import policy_of
from vpo.tasks.bound import BoundTask


@dataclasses.dataclass(frozen=True)
class SFTPlan:
    """A warm start ready to run: the task, the model config it trains (a preset's from random
    weights, or the checkpoint's with `lora_rank` adapters), the checkpoint's Decoder (`init`,
    None from scratch), the pretrained weights it comes from (`source`) and the learning rate."""

    task: BoundTask
    model: ModelConfig
    init: Any
    source: str | None
    learning_rate: float


def assemble_sft(task: BoundTask, spec: str, *, num_answers: int | Sequence[int],
                 seed: int, lora_rank: int = 0, learning_rate: float | None = None,
                 num_parents: int = 2, num_problems: int = 64, at_least: int | None = None,
                 init=None) -> SFTPlan:
    """The SFT warm start of `spec` on `task`: a model preset (trained from scratch on the
    task's tokenizer) or a checkpoint / policy folder (fine-tuned in its own tokenizer, with
    LoRA adapters of `lora_rank` if > 0). The sequence length is `rules.fit_seq_len` over
    `num_problems` problems of `seed` for every m in `num_answers`, mutation prompts with
    `num_parents` parents included, at least `at_least` (default: the checkpoint's context or
    the preset's length); the learning rate is `rules.learning_rate("sft", ...)` unless given.
    `init`: the checkpoint already in memory (not read again)."""
    if lora_rank < 0:
        raise ConfigError(f"lora_rank: {lora_rank} must be >= 0 (0 trains every weight)")
    floor = at_least if at_least is not None else (rules.context_of(spec)
                                                   or ModelConfig.max_seq_len)
    need = rules.fit_seq_len(task, num_answers, num_parents=num_parents, seed=seed,
                             num_problems=num_problems, at_least=floor)
    lr = rules.learning_rate("sft", spec, lora_rank, learning_rate)
    if spec in MODEL_PRESETS:
        if lora_rank:
            raise ConfigError(f"lora_rank: LoRA adapts a pretrained policy; the model preset "
                              f"{spec} is trained from scratch (set 0)")
        cfg = model_preset(spec, vocab_size=task.tokenizer.size, max_seq_len=need)
        return SFTPlan(task, cfg, None, None, lr)
    if init is None:
        init = policy_folder.load_model(spec, max_seq_len=need)[0]
    cfg = dataclasses.replace(init.cfg, lora_rank=lora_rank) if lora_rank else init.cfg
    return SFTPlan(task, cfg, init, rules.source_of(spec), lr)


def run_warm_start(plan: SFTPlan, *, steps: int, batch_size: int,
                   num_answers: int | Sequence[int], seed: int, num_demos: int = 1024,
                   mutation_fraction: float = 0.5, mutation_parents: int = 2,
                   progress: bool = False):
    """`run_sft` on `plan` (the checkpoint's arrays handed to the train state: it is not held
    twice) → (the policy as a plain Decoder, LoRA adapters folded in; losses)."""
    graphdef, state, losses = run_sft(
        plan.task, plan.model, steps, batch_size=batch_size, learning_rate=plan.learning_rate,
        num_answers=num_answers, num_demos=num_demos, seed=seed,
        mutation_fraction=mutation_fraction, mutation_parents=mutation_parents, init=plan.init,
        consume_init=plan.init is not None, progress=progress)
    return policy_of(graphdef, state), losses


def save_warm_start(out_dir: str, plan: SFTPlan, policy, losses: list[float], *, steps: int,
                    num_answers: int | Sequence[int], info: dict | None = None) -> None:
    """The warm start's policy folder: weights, the task's tokenizer, and what it was (task,
    m, steps, first and last loss, the pretrained `source` if any, then `info`)."""
    record = {"task": plan.task.name, "num_answers": num_answers, "sft_steps": steps,
              "sft_loss_first": losses[0], "sft_loss_last": losses[-1],
              **({"source": plan.source} if plan.source else {}), **(info or {})}
    policy_folder.save_policy(out_dir, policy.cfg, nnx.state(policy, nnx.Param), record,
                              tokenizer=plan.task.tokenizer)
