"""The policy as mutation operator on an environment (`vpo search --env`): a candidate is one
multi-turn episode, scored by the environment.

A mutation is itself an episode: the row's first messages (`reset`) with K parents appended
to the last of them, each parent an earlier episode's assistant messages and its reward
vector in tenths (the host search's parent lines, `tasks.prompts.parent_line`), then the
episode runs turn by turn as in training (`vpo.env.episode.run_episodes`: tool calls,
observations through the kept cache) and the environment scores it. The environment itself
sees its own conversation (its first messages, the assistant's, its observations), never the
parents. A plain call (no parents) is an episode from the row's first messages. The island
search, best-of-N and revision of `vpo.search.host` run unchanged on these candidates, with
m = 1 (a candidate is one episode). Mind Evolution (Lee et al., arXiv 2501.09891) with the
environment as the evaluator.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from vpo.env.episode import task_episodes
from vpo.env.task import EnvTask, env_factory
from vpo.errors import ConfigError
from vpo.search.padding import left_pad_rows
from vpo.tasks.base import Record
from vpo.tasks.prompts import parent_line

Parents = Sequence[tuple[str, Sequence[float]]]

ASK = "\nWrite a new attempt that scores higher than these."


def mutation_messages(first: list[dict], parents: Parents, reward_names: Sequence[str]
                      ) -> list[dict]:
    """The first messages of a mutation episode: `first` with the parents (each an earlier
    episode's assistant messages and its rewards) and the request appended to its last."""
    if not parents:
        return [dict(m) for m in first]
    header = f"\nEarlier attempts and their scores ({', '.join(reward_names)}):"
    lines = "".join(parent_line(k, text, r) for k, (text, r) in enumerate(parents, 1))
    last = first[-1]
    return [*map(dict, first[:-1]), {**last, "content": last["content"] + header + lines + ASK}]


def check_one_episode(num_answers: int) -> None:
    """A ConfigError unless m = 1: on an environment a candidate is one episode."""
    if num_answers != 1:
        raise ConfigError(f"--answers {num_answers}: on an environment a candidate is one "
                          "episode (m = 1); drop --answers or give --answers 1")


class EpisodeProposer:
    """`vpo.search.host.Proposer` on an environment task: `__call__(records, parents, key)` →
    (ids_B, rewards_BR, valid_B), one episode per call; the text table holds each episode's
    assistant messages (joined by newlines), which later calls show as a parent."""

    @staticmethod
    def check_answers(task: EnvTask, num_answers: int) -> None:
        """A ConfigError unless m = 1 (a candidate is one episode), then the task's check."""
        check_one_episode(num_answers)
        task.check_num_answers(num_answers)

    def __init__(self, model, task: EnvTask, table, cfg, max_new_tokens: int):
        check_one_episode(cfg.num_answers)
        self.model, self.task, self.table, self.cfg = model, task, table, cfg
        self.max_new_tokens = max_new_tokens
        self.factory = env_factory(task)

    def prompt(self, record: Record, parents: Parents) -> list[int]:
        first = self.task.task.statement(record)
        return self.task.tokenizer.prompt_ids(
            mutation_messages(first, parents, self.task.reward_names))

    def __call__(self, records: Sequence[Record], parents: Sequence[Parents], key):
        tok = self.task.tokenizer
        rows = [self.prompt(r, p) for r, p in zip(records, parents, strict=True)]
        prompts_BP, mask_BP = left_pad_rows(rows, tok.pad_id, self.model.cfg.max_seq_len,
                                            self.max_new_tokens)
        B = len(records)
        keys_B1 = jax.random.split(key, B).reshape(B, 1)
        ep = task_episodes(self.model, self.task, self.factory, [dict(r) for r in records],
                           keys_B1, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                           max_tokens=self.max_new_tokens, prompts=(prompts_BP, mask_BP))
        ids_B = np.asarray([self.table.id_of("\n".join(
            m["content"].strip() for m in ep.messages[b][0] if m["role"] == "assistant"))
            for b in range(B)], np.int32)
        return ids_B, ep.rewards_BGR[:, 0].astype(np.float32), np.ones((B,), bool)
