"""VPO inside a small NNX training loop of your own: advantages -> loss -> grad -> jit, on a
2-device data-parallel mesh (CPU devices here; the same code runs on accelerators).

    python examples/objective/nnx_train_step.py

The model, the rollouts and the rewards are stand-ins: bring your own policy's log-probs and
your task's reward vectors. Needs only jax, flax (for the model) and vpo.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from vpo import objectives  # noqa: E402

B, G, T, M, R, V = 4, 4, 6, 2, 3, 32  # prompts, samples, tokens, answers, rewards, vocab


class TinyLM(nnx.Module):
    """Your policy: anything that gives per-token log-probs of the sampled tokens."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(V, 16, rngs=rngs)
        self.out = nnx.Linear(16, V, rngs=rngs)

    def __call__(self, tokens_BGT):
        return self.out(jnp.tanh(self.embed(tokens_BGT)))  # logits [B, G, T, V]


def token_logp(model, tokens_BGT):
    logits = model(tokens_BGT[..., :-1])
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, tokens_BGT[..., 1:, None], axis=-1)[..., 0]  # [B, G, T-1]


@jax.jit
def train_step(graphdef, params, batch, key):
    """One step: VPO advantages from reward vectors, the VPO paper's loss, SGD."""
    adv_BG, adv_metrics = objectives.vpo_advantages(key, batch["rewards_BGMR"],
                                                    batch["solution_mask_BGM"])

    def loss_fn(params):
        model = nnx.merge(graphdef, params)
        logp_BGT = token_logp(model, batch["tokens_BGT"])
        return objectives.policy_loss(
            logp_BGT, batch["old_logp_BGT"], adv_BG, batch["mask_BGT"],
            ref_logp_BGT=batch["ref_logp_BGT"], **objectives.LOSS_SETTINGS["vpo"])

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, loss, {**metrics, **adv_metrics}


def main():
    model = TinyLM(nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    k_tok, k_rew, k_step = jax.random.split(jax.random.key(0), 3)
    tokens_BGT = jax.random.randint(k_tok, (B, G, T + 1), 0, V)
    old_logp_BGT = token_logp(model, tokens_BGT)  # the behaviour policy = the current one
    batch = {
        "tokens_BGT": tokens_BGT,
        "old_logp_BGT": old_logp_BGT,
        "ref_logp_BGT": old_logp_BGT,
        "mask_BGT": jnp.ones((B, G, T), bool),
        "rewards_BGMR": jax.random.uniform(k_rew, (B, G, M, R)),  # your task's reward vectors
        "solution_mask_BGM": jnp.ones((B, G, M), bool),  # which answers parsed
    }
    # Data parallel: prompts split over the mesh's "data" axis, parameters replicated.
    mesh = jax.make_mesh((jax.device_count(),), ("data",),
                         axis_types=(jax.sharding.AxisType.Auto,))
    batch = jax.device_put(batch, NamedSharding(mesh, P("data")))
    params = jax.device_put(params, NamedSharding(mesh, P()))
    losses = []
    for key in jax.random.split(k_step, 3):
        params, loss, metrics = train_step(graphdef, params, batch, key)
        losses.append(float(loss))
    print(f"devices {jax.device_count()}  losses {[round(x, 4) for x in losses]}  "
          f"clip_frac_high {float(metrics['clip_frac_high']):.3f}  "
          f"vpo/pool_expected_best {float(metrics['vpo/pool_expected_best']):.3f}")
    assert all(map(jnp.isfinite, losses))
    return losses


if __name__ == "__main__":
    main()
