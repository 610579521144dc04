"""Supervised warm start: cross-entropy on a task's demonstrations, prompt tokens masked.

RL needs a base policy that already produces well-formed answers; `run_sft` trains one from the
task's `demonstrations` (diverse valid answers, e.g. maze routes via gold, via diamond, direct).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vpo import data as data_lib
from vpo import sharding as sharding_lib
from vpo.config import ModelConfig
from vpo.tasks.base import Task, encode_completion, index_problem
from vpo.train import (
    TrainState,
    _masked_mean,
    _select,
    _tree_finite,
    completion_logp,
    init_state,
    make_optimizer,
)
from vpo.train_config import TrainConfig


def sft_step(state: TrainState, batch, *, graphdef, tx):
    """Cross-entropy on demonstration completions given prompts (prompt tokens carry no loss).

    batch: {"prompt_BP", "prompt_mask_BP", "target_BT" int32, "target_mask_BT" bool}.
    A non-finite loss or gradient skips the update. Returns (state, {"loss", "skipped_updates"}).
    """

    def loss_fn(params):
        model = nnx.merge(graphdef, params)
        logp_B1T, _ = completion_logp(model, batch["prompt_BP"], batch["prompt_mask_BP"],
                                      batch["target_BT"][:, None])
        m_BT = batch["target_mask_BT"]
        return -_masked_mean(logp_B1T[:, 0], m_BT)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    finite = jnp.isfinite(loss) & _tree_finite(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    new_state = state._replace(step=state.step + 1,
                               params=_select(finite, new_params, state.params),
                               opt_state=_select(finite, new_opt, state.opt_state))
    return new_state, {"loss": loss, "skipped_updates": (~finite).astype(jnp.int32)}


def demonstration_set(task: Task, num: int, num_answers: int, seed: int) -> dict[str, np.ndarray]:
    """`num` problems with one demonstration each, as padded arrays for `sft_step`."""
    problems = task.make_problems(seed, num)
    prompts, pmask = data_lib.prompt_arrays(task, problems, num_answers)
    rng = np.random.default_rng(seed)
    T = task.completion_len(num_answers)
    targets = [encode_completion(task.vocab, task.demonstrations(
        index_problem(problems, i), rng, num_answers), T) for i in range(num)]
    return dict(prompt_BP=prompts, prompt_mask_BP=pmask,
                target_BT=np.stack([t for t, _ in targets]),
                target_mask_BT=np.stack([m for _, m in targets]))


def run_sft(task: Task, model_cfg: ModelConfig, steps: int, *, batch_size: int = 32,
            learning_rate: float = 3e-3, num_answers: int = 1, num_demos: int = 1024,
            seed: int = 0, mesh=None) -> tuple[nnx.GraphDef, TrainState, list[float]]:
    """Supervised fine-tuning on the task's demonstrations → (graphdef, state, losses)."""
    mesh = sharding_lib.make_mesh(devices=jax.devices()[:1]) if mesh is None else mesh
    tcfg = TrainConfig(steps=steps, learning_rate=learning_rate, warmup_steps=min(20, steps // 10),
                       schedule="cosine", batch_size=batch_size)
    tx = make_optimizer(tcfg)
    graphdef, state, _ = init_state(model_cfg, tx, mesh, seed=seed)
    demos = demonstration_set(task, num_demos, num_answers, seed)
    step = jax.jit(functools.partial(sft_step, graphdef=graphdef, tx=tx), donate_argnums=0)
    rng = np.random.default_rng(seed)
    losses = []
    pending = None
    for _ in range(steps):
        idx = rng.integers(0, num_demos, size=batch_size)
        batch = {k: jax.device_put(v[idx], sharding_lib.batch_sharding(mesh, v.ndim))
                 for k, v in demos.items()}
        state, metrics = step(state, batch)
        if pending is not None:
            losses.append(float(pending["loss"]))
        pending = metrics
    losses.append(float(pending["loss"]))
    return graphdef, state, losses
