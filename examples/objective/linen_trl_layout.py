"""An estimator by name inside a Flax Linen training step, with TRL's flat layout: one row per
completion, `[B·G, T]`, and `num_generations` = G consecutive rows per prompt (as TRL's
GRPOTrainer holds them). `to_groups` / `from_groups` convert; the step is jitted and runs on a
2-device mesh.

    python examples/objective/linen_trl_layout.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from vpo import objectives  # noqa: E402

NUM_PROMPTS, NUM_GENERATIONS, T, V = 4, 4, 6, 32


class TinyLM(nn.Module):
    @nn.compact
    def __call__(self, tokens_NT):
        return nn.Dense(V)(jnp.tanh(nn.Embed(V, 16)(tokens_NT)))


def token_logp(params, tokens_NT):
    logp = jax.nn.log_softmax(TinyLM().apply(params, tokens_NT[:, :-1]))
    return jnp.take_along_axis(logp, tokens_NT[:, 1:, None], axis=-1)[..., 0]  # [N, T]


estimator = objectives.get_estimator("grpo", scale="group")  # or "dr_grpo", "rloo", "maxk", ...


@jax.jit
def train_step(params, tokens_NT, old_logp_NT, mask_NT, rewards_N):
    adv_BG, adv_metrics = estimator(None, objectives.to_groups(rewards_N, NUM_GENERATIONS))

    def loss_fn(params):
        logp_NT = token_logp(params, tokens_NT)
        group = lambda x: objectives.to_groups(x, NUM_GENERATIONS)  # noqa: E731
        return objectives.policy_loss(group(logp_NT), group(old_logp_NT), adv_BG, group(mask_NT),
                                      **objectives.LOSS_SETTINGS["dapo"])

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    # per-completion advantages back in TRL's layout, e.g. to log beside its own
    return params, loss, objectives.from_groups(adv_BG), {**metrics, **adv_metrics}


def main():
    N = NUM_PROMPTS * NUM_GENERATIONS
    k_init, k_tok, k_rew = jax.random.split(jax.random.key(0), 3)
    tokens_NT = jax.random.randint(k_tok, (N, T + 1), 0, V)
    params = TinyLM().init(k_init, tokens_NT[:, :-1])
    old_logp_NT = token_logp(params, tokens_NT)
    mask_NT = jnp.ones((N, T), bool)
    rewards_N = jax.random.bernoulli(k_rew, 0.5, (N,)).astype(jnp.float32)  # TRL-style rewards

    mesh = jax.make_mesh((jax.device_count(),), ("data",),
                         axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))  # whole prompt groups per device: N / 2 rows each
    tokens_NT, old_logp_NT, mask_NT, rewards_N = jax.device_put(
        (tokens_NT, old_logp_NT, mask_NT, rewards_N), rows)
    for _ in range(3):
        params, loss, adv_N, metrics = train_step(params, tokens_NT, old_logp_NT, mask_NT,
                                                  rewards_N)
    print(f"devices {jax.device_count()}  loss {float(loss):.4f}  adv_N {adv_N.shape}  "
          f"nonfinite rewards {int(metrics['adv/nonfinite_rewards'])}")
    assert adv_N.shape == (N,) and bool(jnp.isfinite(loss))
    return adv_N


if __name__ == "__main__":
    main()
