"""Pytrees passed between the sampler, tasks, objectives and trainer.

Dimension key (shape suffixes on names; each letter has this one meaning wherever it is used):
B prompts (rows of a batch, one group each) · G samples per prompt · M answers per sample ·
R reward components · K Dirichlet weight draws · U parents shown in one mutation prompt ·
P prompt tokens · T generated tokens · O sequence positions of one forward call (P+T, or the
new tokens of one call) · S slots of a decode state that takes new prompts ·
A tokens of one answer · V vocab (a model's tokens, or a task's answer symbols) ·
D model width · F MLP width · H query heads · Z KV heads ·
E head dim · L layers · C cache length · N rows of a flat batch (problems, or rows flattened
from several axes) · I islands · Q members per island · X candidate slots of a population ·
Y candidate slots of a second population (compared with X's) · J top log-probs per token ·
W row width (a packed row, an observation queue, a token's or a symbol's bytes, a grid).
`tests/project/test_architecture.py` checks that every shape suffix in the package uses these
letters.
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class Rollout(NamedTuple):
    """G sampled completions for each of B prompts.

    `logp_BGT` is the log-prob of each sampled token under the unmodified model (temperature 1,
    no filtering): what the training forward recomputes. `sample_logp_BGT` is its log-prob under
    the distribution actually sampled from (temperature, top-k, top-p; 0 for greedy).
    `entropy_BGT` is the model's (temperature-1) token entropy. `mask_BGT` marks real completion
    tokens, the stop token included; positions after it hold the pad id (which may be an
    ordinary token: the mask, not the value, says what was generated).
    """

    tokens_BGT: jax.Array  # int32
    logp_BGT: jax.Array  # float32
    sample_logp_BGT: jax.Array  # float32
    entropy_BGT: jax.Array  # float32
    mask_BGT: jax.Array  # bool
    length_BG: jax.Array  # int32, number of masked-in tokens
    finished_BG: jax.Array  # bool, emitted a stop token within the budget


class SearchCalls(NamedTuple):
    """One generation of the island search's policy calls, grouped for the update of the
    search that learns (`vpo.search.learn` → `vpo.rl.search_update`): B groups (an island of
    a problem), G calls each (the island's mutation prompts of the generation), each call one
    completion of M answers. `logp_BGT` is the sampler's temperature-1 log-prob of each token
    under the parameters that drew it; `valid_BGM`: the answer parsed (and repeats no earlier
    answer of its completion); rewards are 0 where it did not."""

    prompt_BGP: jax.Array  # int32, each call's prompt, left-padded
    prompt_mask_BGP: jax.Array  # bool
    tokens_BGT: jax.Array  # int32, the sampled completion
    mask_BGT: jax.Array  # bool, its real tokens (the stop token included)
    logp_BGT: jax.Array  # float32
    rewards_BGMR: jax.Array  # float32
    valid_BGM: jax.Array  # bool
