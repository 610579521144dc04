"""The RL step on an environment: multi-turn episodes on the host, the one jitted update.

`make_env_rl_step` returns a `HostRLStep` (the loop runs it like a host-reward step):

- sample: B rows × G episodes (`vpo.env.episode.run_episodes`), one new environment each,
  with the policy of the current state and one key per episode (drawn as the in-graph step
  draws its sampling keys). The rollout is [B, G, T], T = `sampler.max_new_tokens` the token
  budget of an episode; its mask holds the assistant's tokens only.
- score: the episodes' reward vectors as VPO's sets. With m = `episodes_per_set`, the G
  episodes of a row form G/m sets of m (episodes g with the same g // m); each episode's
  rewards_GMR row holds its set's m reward vectors, so an estimator over m answers (VPO's
  E_w[max_j wᵀr_j], Multi-RLVR's sum) gives every episode of a set the set's value, and the
  group normalisation over G entries (each set counted m times) equals that over the G/m sets
  (same mean, same population spread). m = 1: each episode is one answer (GRPO family).
- update: `update_from_rollout`, unchanged: the log-probs over the whole conversation
  (observations as context), the loss on the assistant's tokens.

A verifiers 0.4 environment (`verifiers.v1`, its factory's episodes `through_endpoint`) samples
with `vpo.rl.env_served.run_served_episodes` instead: its harness runs the episodes against the
policy served on a local port, and the rollout holds the token ids the server sampled
(`env/turns_trained`: the share of its completions trained on).

Metrics of the episodes join the step's: `env/turns`, `env/observation_tokens`,
`env/ended` (the share ended by the environment or the turn limit, not cut off). The sample
log shows every message of an episode (`EnvRLStep.sample_rows`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import ConfigError
from vpo.env.episode import task_episodes
from vpo.env.task import EnvTask, check_env_run, env_factory
from vpo.rl.env_served import run_served_episodes
from vpo.rl.step import HostRLStep, StepConfig, model_of, sample_keys_BG, update_from_rollout
from vpo.tasks.bound import BoundTask


def episode_sets(rewards_BGR: np.ndarray, applies_BGR: np.ndarray, m: int):
    """Each episode's set of m reward vectors → (rewards_BGMR, solution_mask_BGM,
    applies_BGMR): episode g's row holds episodes m·(g // m) … m·(g // m) + m − 1."""
    B, G, R = rewards_BGR.shape
    if G % m:
        raise ConfigError(f"sampler.num_samples: {G} episodes per row do not split into sets "
                          f"of episodes_per_set={m}; use a multiple of {m}")
    sets = rewards_BGR.reshape(B, G // m, m, R)  # [B, G/m sets, m, R]
    applies_sets = applies_BGR.reshape(B, G // m, m, R)
    rewards_BGMR = np.repeat(sets, m, axis=1)
    applies_BGMR = np.repeat(applies_sets, m, axis=1)
    return rewards_BGMR, np.ones((B, G, m), bool), applies_BGMR


@dataclasses.dataclass(frozen=True)
class EnvRLStep(HostRLStep):
    """A `HostRLStep` whose sampling ran episodes: `last["episodes"]` holds the latest ones
    (their messages for the sample log, `sample_rows`)."""

    last: dict = dataclasses.field(default_factory=dict)

    def sample_rows(self, task: BoundTask, max_rows: int = 4) -> list[dict[str, Any]]:
        """The first row's first `max_rows` episodes as JSON-able rows: every message, the
        reward vector, the w* score, turns and observation tokens."""
        ep = self.last["episodes"]
        rows = []
        for g in range(min(max_rows, len(ep.messages[0]))):
            r = ep.rewards_BGR[0, g]
            said = [m["content"] for m in ep.messages[0][g] if m["role"] == "assistant"]
            rows.append({"prompt": ep.messages[0][g][0]["content"],
                         "completion": said[-1] if said else "",
                         "messages": ep.messages[0][g], "rewards": np.round(r, 4).tolist(),
                         "score": float(r @ task.eval_weights_R),
                         "turns": int(ep.turns_BG[0, g]),
                         "observation_tokens": int(ep.observation_tokens_BG[0, g])})
        return rows


def make_env_update(graphdef, tx, task: BoundTask, cfg: StepConfig):
    """The step's one jitted program, the state donated: (state, batch, rollout [B, G, T],
    rewards_BGMR, solution_mask_BGM) → (state, metrics) (`update_from_rollout`)."""
    return jax.jit(lambda state, batch, rollout, rewards, smask: update_from_rollout(
        state, batch, rollout, rewards, smask, graphdef=graphdef, tx=tx, task=task, cfg=cfg),
        donate_argnums=0)


def make_env_rl_step(graphdef, tx, task: EnvTask, cfg: StepConfig, records) -> EnvRLStep:
    """The environment step (see the module docstring). `records`: the rows that
    batch["problems"]["index"] points into."""
    settings = task.settings
    factory = env_factory(task)
    m = settings.episodes_per_set
    check_env_run(cfg, m)
    last: dict[str, Any] = {}
    served = getattr(factory, "through_endpoint", False)  # verifiers.v1 (vpo.rl.env_served)

    def sample(state, batch):
        index = np.asarray(jax.device_get(batch["problems"]["index"])).reshape(-1)
        rows = [records[int(i)] for i in index]
        B, G = len(rows), cfg.sampler.num_samples
        keys_BG = sample_keys_BG(state, B, G)
        s = cfg.sampler
        prompts = (np.asarray(jax.device_get(batch["prompt_BP"])),
                   np.asarray(jax.device_get(batch["prompt_mask_BP"])))
        if served:
            seed = int(np.asarray(jax.random.key_data(keys_BG))[0, 0, -1] >> 1)
            episodes, trained = run_served_episodes(
                model_of(graphdef, state), task.tokenizer, factory, rows, G, prompts=prompts,
                max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                top_k=s.top_k, seed=seed, where=settings.spec, context=s.served_context)
            last["episodes"], last["trained"] = episodes, trained
            return episodes.rollout
        episodes = task_episodes(
            model_of(graphdef, state), task, factory, rows, keys_BG, temperature=s.temperature,
            top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_new_tokens, prompts=prompts)
        last["episodes"] = episodes
        return episodes.rollout

    def score(batch, rollout):
        ep = last["episodes"]
        return episode_sets(ep.rewards_BGR, ep.applies_BGR, m)

    jitted = make_env_update(graphdef, tx, task, cfg)

    def update(state, batch, rollout, rewards, smask):
        state, metrics = jitted(state, batch, rollout, jnp.asarray(rewards), jnp.asarray(smask))
        ep = last["episodes"]
        metrics = {**metrics, "env/turns": float(ep.turns_BG.mean()),
                   "env/observation_tokens": float(ep.observation_tokens_BG.mean()),
                   "env/ended": float(np.asarray(ep.rollout.finished_BG).mean())}
        if served:  # the share of the episodes' completions trained on (env_served)
            metrics["env/turns_trained"] = float(last["trained"].sum() / max(1, ep.turns_BG.sum()))
        return state, metrics

    return EnvRLStep(sample, score, update, tuple(task.reward_names), last)
