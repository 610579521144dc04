"""A task bound to a tokenizer: prompts as token arrays, the generation budget, and rewards read
from generated tokens, on the host (text) and in the graph (bytes), which agree exactly.

    bound = bind(task, tokenizer)          # any `vpo.io.tokenizer.Tokenizer`
    records = bound.make_problems(seed, n)
    prompts_NP, mask_NP = bound.prompt_arrays(records, m)         # chat template, left-padded
    rewards_MR, valid_M = bound.reward(problem, tokens_T, mask_T, m)   # in-graph, one completion
    rewards_NMR, valid_NM = bound.host_score(records, tokens_NT, mask_NT, m)  # the host twin

The bound task's type is its kind: `GraphTask` (rewards read in the graph), `HostTask` (the
host scorer), or the type a task names in `Task.bound_type` (an environment's
`vpo.env.task.EnvTask`, a HostTask). A caller that does one thing per kind looks its function
up once in a table keyed by these types (`for_kind`).

Prompt text (the user message; the tokenizer's chat template wraps it):

    <statement>
    Give 3 different answers, <answer 1> ... </answer 1> to <answer 3> ... </answer 3>, each <hint>.

Search mutation prompt text (`mutation_text`; built in the graph by `mutation_prompt` from the
parents' symbol ids, so the same prompt serves search, SFT and RL on mutation prompts):

    <statement>
    Earlier answers and their scores (completion, gold, diamond, avoid_lava):
    Answer 1: U R R D | scores: 1.0 0.5 0.0 1.0
    Give 3 better answers, <answer 1> ... </answer 1> to <answer 3> ... </answer 3>, each <hint>.

The in-graph reader sees the first `T · byte_cap` bytes of a T-token generation, each token's
bytes cut at `byte_cap` (`Tokenizer.token_bytes`); `host_score` reads the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from vpo.io.tokenizer import Tokenizer, left_pad
from vpo.tasks import answers as answers_lib
from vpo.tasks.base import (
    Record,
    Task,
    check_score_output,
    check_symbol_rewards,
    symbol_words,
)
from vpo.tasks.prompts import (
    answer_instruction,
    mutation_text,
    parents_header,
    prompt_text,
)

# size: one job, a task read and written through one tokenizer: prompts, mutation prompts and
# the readers of generations on the host and in the graph share its tables; its kinds (the
# subclasses `bind` picks) are a few lines at the end.
Entry = TypeVar("Entry")
BYTE_CAP = 16  # bytes of one token the in-graph reader keeps (long whitespace runs are cut)


def pack_left_padded(segments: Sequence[tuple[jax.Array, jax.Array]], length: int, pad_id: int
                     ) -> tuple[jax.Array, jax.Array]:
    """Concatenate the kept tokens of (tokens, keep) segments, left-padded to `length` →
    (tokens_P int32, mask_P bool). `length` must cover the summed static segment sizes."""
    flat_tokens = jnp.concatenate([jnp.asarray(t, jnp.int32).reshape(-1) for t, _ in segments])
    flat_keep = jnp.concatenate([jnp.broadcast_to(jnp.asarray(k, bool), jnp.shape(t)).reshape(-1)
                                 for t, k in segments])
    L = flat_tokens.shape[0]
    if length < L:
        raise ValueError(f"length={length} is shorter than the {L} tokens the segments can hold")
    n = jnp.sum(flat_keep.astype(jnp.int32))
    flat_pos = jnp.where(flat_keep, jnp.cumsum(flat_keep.astype(jnp.int32)) - 1 + (length - n),
                         length)
    tokens_P = jnp.full((length,), pad_id, jnp.int32).at[flat_pos].set(flat_tokens, mode="drop")
    return tokens_P, jnp.arange(length) >= length - n


def _piece_table(tok: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids_XL int32, keep_XL bool): each text's token ids, padded to the longest."""
    ids = [tok.encode(t) for t in texts]
    L = max(1, max(len(i) for i in ids))
    table = np.zeros((len(ids), L), np.int32)
    for x, i in enumerate(ids):
        table[x, :len(i)] = i
    return table, np.arange(L)[None, :] < np.array([len(i) for i in ids])[:, None]


@dataclasses.dataclass(frozen=True, eq=False)
class BoundTask:
    """`task` read and written through `tokenizer` (hashable by identity: a static jit arg).

    Its kind is its type, which `bind` picks: `GraphTask` (rewards read in the graph),
    `HostTask` (the host scorer on decoded text), and `vpo.env.task.EnvTask` (a HostTask whose
    candidates are environment episodes). A caller with one function per kind looks it up
    once with `for_kind`."""

    task: Task
    tokenizer: Tokenizer

    # -- the task's own fields ---------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def reward_names(self) -> tuple[str, ...]:
        return self.task.reward_names

    @property
    def eval_weights_R(self) -> np.ndarray:  # noqa: N802  (shape suffix)
        return self.task.eval_weights_R

    @property
    def num_rewards(self) -> int:
        return self.task.num_rewards

    @property
    def answer_len(self) -> int:
        return self.task.answer_len

    @property
    def is_host(self) -> bool:
        return self.task.is_host

    @property
    def has_mutation_demonstrations(self) -> bool:
        return self.task.mutation_demonstrations is not None and not self.task.is_host

    # what a caller asks of the kind, answered by the type (`GraphTask`, `HostTask`, `EnvTask`)
    writes_own_prompts = True  # its prompts are the task's own text (an environment: its own)

    def sample_problems(self, seed: int, num: int) -> list[Record]:
        """`num` problems of `seed` for a command: a data file's rows (which `make_problems`
        takes in file order) are a sample of `num` rows drawn with `seed`, kept in file order;
        other tasks' are `make_problems(seed, num)`."""
        from vpo.tasks.base import ROW

        records = self.make_problems(seed, num)
        if not records or ROW not in records[0]:
            return records
        rows = self.make_problems(seed, 1 << 62)  # every row of the file
        if len(rows) <= num:
            return rows
        pick = np.sort(np.random.default_rng(seed).choice(len(rows), size=num, replace=False))
        return [rows[i] for i in pick]

    def check_run(self, run: Any) -> None:
        """Checks of a run's settings (`vpo.config.RunConfig`) that this kind adds to
        `vpo.rl.checks.check_run`'s: none but an environment's (`EnvTask`)."""

    def solved(self, rewards_R):
        return self.task.solved(rewards_R)

    def make_problems(self, seed: int, num: int) -> list[Record]:
        return self.task.make_problems(seed, num)

    def check_num_answers(self, num_answers: int) -> None:
        self.task.check_num_answers(num_answers)

    # -- budgets -----------------------------------------------------------------------------

    @functools.cached_property
    def _word_tokens(self) -> int:
        """Most tokens one answer word takes (a leading space included); 1 for a task without
        symbols or words (a dataset: the budget is then the floor, sampler.max_new_tokens)."""
        words = self.task.symbols if self.task.symbols is not None else self.task.words
        if not words:
            return 1
        return max(len(self.tokenizer.encode(" " + w)) for w in words)

    def completion_len(self, num_answers: int) -> int:
        """T budget for m answers in tags: per slot the open tag, A words, the close tag and a
        newline, plus one stop token."""
        self.check_num_answers(num_answers)
        tok = self.tokenizer
        A = self.answer_len if self.task.symbols is not None else max(self.answer_len, 1)
        n = 1 + (num_answers - 1) * len(tok.encode("\n"))
        for k in range(1, num_answers + 1):
            n += (len(tok.encode(answers_lib.open_tag(k))) + A * self._word_tokens
                  + len(tok.encode(" " + answers_lib.close_tag(k))))
        return n

    @functools.cached_property
    def byte_cap(self) -> int:
        """Bytes per token the in-graph reader keeps."""
        return int(min(self.tokenizer.token_bytes()[0].shape[1], BYTE_CAP))

    def num_bytes(self, num_tokens: int) -> int:
        """X, the bytes of a T-token generation that the readers see."""
        return num_tokens * self.byte_cap

    # -- prompts -----------------------------------------------------------------------------

    def prompt_ids(self, record: Record, num_answers: int) -> list[int]:
        return self.tokenizer.prompt_ids(prompt_text(self.task, record, num_answers))

    def prompt_arrays(self, records: Sequence[Record], num_answers: int,
                      length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(tokens_NP int32, mask_NP bool): every record's prompt through the chat template,
        left-padded with the pad id to `length` (default: the longest)."""
        self.check_num_answers(num_answers)
        return left_pad([self.prompt_ids(r, num_answers) for r in records], length,
                        self.tokenizer.pad_id, what="prompt")

    def demonstration_ids(self, record: Record, rng: np.random.Generator, num_answers: int
                          ) -> list[int]:
        """SFT target: the task's demonstrated answers in tags, then the first stop id."""
        return self.answers_ids(self.task.demonstrations(record, rng, num_answers))

    def answers_ids(self, answers: Sequence[str]) -> list[int]:
        """Completion ids of given answer texts (in tags, or the one answer as written for a
        `tagless_single` task), then the first stop id."""
        if self.task.tagless_single and len(answers) == 1:
            text = answers[0]
        else:
            text = answers_lib.format_answers(answers)
        return [*self.tokenizer.encode(text), self.tokenizer.eos_id]

    # -- mutation prompts (search) -----------------------------------------------------------

    def mutation_heads(self, records: Sequence[Record]) -> tuple[np.ndarray, np.ndarray]:
        """(head_NP, head_mask_NP): chat prefix + statement + the parents header, left-padded."""
        prefix, _ = self._affixes
        rows = [prefix + self.tokenizer.encode(self.task.statement(r) + parents_header(self.task))
                for r in records]
        return left_pad(rows, None, self.tokenizer.pad_id, what="mutation prompt head")

    @functools.cached_property
    def _affixes(self) -> tuple[list[int], list[int]]:
        return self.tokenizer.chat_affixes()

    @functools.cached_property
    def _pieces(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        tok, task = self.tokenizer, self.task
        if task.symbols is None:
            raise ValueError(f"{self.name}: mutation prompts in the graph need a symbol task")
        return {"answer_k": _piece_table(tok, [f"\nAnswer {k}:" for k in range(1, 65)]),
                "symbol": _piece_table(tok, [" " + s for s in task.symbols]),
                "scores": _piece_table(tok, [" | scores:"]),
                "tenths": _piece_table(tok, [f" {q / 10:.1f}" for q in range(11)])}

    def _tail(self, num_answers: int) -> list[int]:
        _, suffix = self._affixes
        return self.tokenizer.encode(
            "\n" + answer_instruction(self.task, num_answers, better=True)) + suffix

    def mutation_prompt_len(self, head_len: int, num_parents: int, num_answers: int) -> int:
        """Static length of `mutation_prompt` with a head of `head_len` and U parents."""
        p = self._pieces
        per_parent = (p["answer_k"][0].shape[1] + self.answer_len * p["symbol"][0].shape[1]
                      + self.num_rewards * p["tenths"][0].shape[1])
        if not self.task.scores_per_symbol:
            per_parent += p["scores"][0].shape[1]
        return head_len + num_parents * per_parent + len(self._tail(num_answers))

    def mutation_prompt(self, head_P, head_mask_P, parents_UA, parent_mask_UA,
                        parent_rewards_UR, num_answers: int) -> tuple[jax.Array, jax.Array]:
        """In-graph mutation prompt → (tokens_P2, mask_P2), left-padded to
        `mutation_prompt_len`. parents_UA: symbol ids; a parent with an all-False mask is left
        out; rewards are written in tenths. Decodes to `mutation_text` of the same parents."""
        p = {k: (jnp.asarray(t), jnp.asarray(m)) for k, (t, m) in self._pieces.items()}
        U, A = parents_UA.shape
        present_U = jnp.any(parent_mask_UA, axis=-1)
        number_U = jnp.cumsum(present_U.astype(jnp.int32)) - 1  # present parents count 1, 2, ..
        segments = [(head_P, head_mask_P)]
        tenths_UR = jnp.clip(jnp.round(parent_rewards_UR.astype(jnp.float32) * 10), 0, 10
                             ).astype(jnp.int32)
        for q in range(U):
            sym_A = jnp.clip(parents_UA[q], 0, p["symbol"][0].shape[0] - 1)
            number = (p["answer_k"][0][number_U[q]], p["answer_k"][1][number_U[q]] & present_U[q])
            symbols = (p["symbol"][0][sym_A], p["symbol"][1][sym_A] & parent_mask_UA[q][:, None])
            scores = (p["tenths"][0][tenths_UR[q]], p["tenths"][1][tenths_UR[q]])
            if self.task.scores_per_symbol:  # each symbol, then its own score: [A, 2 pieces]
                segments += [number, (jnp.concatenate([symbols[0], scores[0]], -1),
                                      jnp.concatenate([symbols[1], scores[1]
                                                       & parent_mask_UA[q][:, None]], -1))]
                continue
            segments += [number, symbols, (p["scores"][0][0], p["scores"][1][0] & present_U[q]),
                         (scores[0], scores[1] & present_U[q])]
        tail = jnp.asarray(self._tail(num_answers), jnp.int32)
        segments.append((tail, jnp.ones(tail.shape, bool)))
        length = self.mutation_prompt_len(head_P.shape[-1], U, num_answers)
        return pack_left_padded(segments, length, self.tokenizer.pad_id)

    def parent_symbols(self, parents: Sequence[Sequence[str]], num_parents: int
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Parent answer texts per problem → (symbols_NUA int32, mask_NUA bool), U slots (absent
        or malformed parents: all-False masks)."""
        U, A = num_parents, self.answer_len
        index = {s: i for i, s in enumerate(self.task.symbols)}
        sym = np.zeros((len(parents), U, A), np.int32)
        mask = np.zeros((len(parents), U, A), bool)
        for n, row in enumerate(parents):
            for k, text in enumerate(row[:U]):
                words = symbol_words(text, self.task.symbols, A)
                if words:
                    sym[n, k, :len(words)] = [index[w] for w in words]
                    mask[n, k, :len(words)] = True
        return sym, mask

    def mutation_prompt_arrays(self, records: Sequence[Record],
                               parents: Sequence[Sequence[str]], num_answers: int,
                               num_parents: int) -> dict[str, np.ndarray]:
        """Mutation prompts of given parent answer texts (at most U per problem), each scored by
        the task as a one-answer generation, built by the in-graph `mutation_prompt` →
        {"prompt_BP", "prompt_mask_BP", "parent_rewards_BUR", "parent_valid_BU"} (numpy)."""
        U = num_parents
        sym_NUA, mask_NUA = self.parent_symbols(parents, U)
        texts = [[self.symbols_text(a, m) if m.any() else None for a, m in zip(s, k, strict=True)]
                 for s, k in zip(sym_NUA, mask_NUA, strict=True)]
        flat = [[t] for row in texts for t in row]
        rew, valid = self.task.score([r for r in records for _ in range(U)], flat)
        rew_NUR = rew[:, 0].reshape(len(records), U, -1)
        valid_NU = valid[:, 0].reshape(len(records), U)
        head_NP, hmask_NP = self.mutation_heads(records)
        tokens, mask = self._mutation_builder(num_answers)(
            head_NP, hmask_NP, sym_NUA, mask_NUA & valid_NU[..., None],
            np.where(valid_NU[..., None], rew_NUR, 0.0))
        return {"prompt_BP": np.asarray(tokens, np.int32), "prompt_mask_BP": np.asarray(mask),
                "parent_rewards_BUR": rew_NUR, "parent_valid_BU": valid_NU}

    @functools.cache  # noqa: B019  (one compiled builder per m; the task lives as long)
    def _mutation_builder(self, num_answers: int):
        """`mutation_prompt` vmapped over problems and jitted, built once per m."""
        return jax.jit(jax.vmap(functools.partial(self.mutation_prompt,
                                                  num_answers=num_answers)))

    # -- reading generations -----------------------------------------------------------------

    @functools.cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        bytes_VW, len_V = self.tokenizer.token_bytes()
        cap = self.byte_cap
        sym_VW, sym_len_V = answers_lib.symbol_table(self.task.symbols or ("?",))
        return (bytes_VW[:, :cap].astype(np.int32), np.minimum(len_V, cap).astype(np.int32),
                sym_VW, sym_len_V)

    def completion_texts(self, tokens_NT, mask_NT) -> list[str]:
        """The host text of each generation: the bytes the in-graph reader sees, as UTF-8."""
        bytes_VW, len_V, _, _ = self._tables
        tokens_NT, mask_NT = np.asarray(tokens_NT), np.asarray(mask_NT)
        X = self.num_bytes(tokens_NT.shape[-1])
        out = []
        for t_T, m_T in zip(tokens_NT, mask_NT, strict=True):
            n = int(np.argmin(m_T)) if not m_T.all() else len(m_T)  # leading run of True
            ids = [i for i in t_T[:n] if 0 <= i < bytes_VW.shape[0]]  # as the graph reader
            raw = b"".join(bytes(bytes_VW[i, :len_V[i]].astype(np.uint8)) for i in ids)
            out.append(raw[:X].decode("utf-8", errors="replace"))
        return out

    def parse(self, completion_T, mask_T, num_answers: int, *, dedup: bool = True):
        """In-graph answers of one generation → (symbols_MA, mask_MA, valid_M); with `dedup`
        (training, search) duplicates of an earlier valid answer are invalid, without it
        (evaluation: every parsed answer is a candidate) repeats are kept."""
        bytes_VW, len_V, sym_VW, sym_len_V = (jnp.asarray(x) for x in self._tables)
        text, live = answers_lib.completion_bytes(completion_T, mask_T, bytes_VW, len_V,
                                                  self.num_bytes(completion_T.shape[-1]))
        sym_MA, smask_MA, valid_M = answers_lib.read_symbols(
            text, live, sym_VW, sym_len_V, num_answers=num_answers, answer_len=self.answer_len)
        if dedup:
            valid_M = answers_lib.first_occurrence(sym_MA, smask_MA, valid_M)
        return sym_MA, smask_MA & valid_M[:, None], valid_M

    def score_symbols(self, problem, symbols_NA, mask_NA) -> tuple[jax.Array, jax.Array]:
        """Rewards of single answers given as symbol ids → (rewards_NR, valid_N = 1..A symbols)."""
        valid_N = jnp.any(mask_NA, axis=-1)
        rewards_NR = jax.vmap(self.task.symbol_reward, in_axes=(None, 0, 0))(
            problem, symbols_NA, mask_NA)
        check_symbol_rewards(self.task, rewards_NR, symbols_NA.shape[0])
        return jnp.where(valid_N[:, None], rewards_NR, 0.0).astype(jnp.float32), valid_N

    def reward(self, problem, completion_T, mask_T, num_answers: int):
        """In-graph reward of one generation for ONE problem (`task.arrays` without N) →
        (rewards_MR float32, valid_M bool); equals `host_score`."""
        if self.is_host:
            raise ValueError(f"{self.name} scores on the host; use host_score")
        sym_MA, smask_MA, valid_M = self.parse(completion_T, mask_T, num_answers)
        rewards_MR, _ = self.score_symbols(problem, sym_MA, smask_MA)
        return jnp.where(valid_M[:, None], rewards_MR, 0.0), valid_M

    def parse_text(self, text: str, num_answers: int) -> list[str | None]:
        """The m answer slots of a generation's text (`answers.parse_answers`); for a
        `tagless_single` task with m = 1 the whole stripped text is the one answer."""
        if self.task.tagless_single and num_answers == 1:
            return [text.strip() or None]
        return answers_lib.parse_answers(text, num_answers)

    def host_score(self, records: Sequence[Record], tokens_NT, mask_NT, num_answers: int
                   ) -> tuple[np.ndarray, np.ndarray]:
        """The task's host scorer on the generations' text → (rewards_NMR, valid_NM)."""
        return self.host_score_applies(records, tokens_NT, mask_NT, num_answers)[:2]

    def host_score_applies(self, records: Sequence[Record], tokens_NT, mask_NT,
                           num_answers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`host_score` and applies_NMR (`Task.score_applies`: False where a component does not
        apply to a valid answer; all True for a task without it)."""
        parsed = [self.parse_text(t, num_answers)
                  for t in self.completion_texts(tokens_NT, mask_NT)]
        records = list(records)
        if self.task.score_applies is not None:
            return check_score_output(self.task, self.task.score_applies(records, parsed),
                                      records, num_answers, applies=True)
        rewards, valid = check_score_output(self.task, self.task.score(records, parsed),
                                            records, num_answers)
        return rewards, valid, np.ones(rewards.shape, bool)

    def symbols_text(self, symbols_A, mask_A) -> str:
        """An answer given as symbol ids, as text (words joined by single spaces)."""
        return " ".join(self.task.symbols[int(s)] for s, m in zip(symbols_A, mask_A,
                                                                    strict=True) if m)

    def problem_arrays(self, records: Sequence[Record]) -> dict[str, Any]:
        """The problems as the graph sees them: {"index": int32 [N], "task": task.arrays or
        absent for host tasks}."""
        out: dict[str, Any] = {"index": np.arange(len(records), dtype=np.int32)}
        if not self.is_host:
            out["task"] = jax.tree.map(np.asarray, self.task.arrays(records))
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class GraphTask(BoundTask):
    """A task whose rewards are read in the graph (`symbols`, `symbol_reward`): the RL step is
    one jit, the search runs in the graph, its answer budget is the task's own."""

    is_host = False


@dataclasses.dataclass(frozen=True, eq=False)
class HostTask(BoundTask):
    """A task scored by its host scorer on decoded text (a user's data, arithmetic): one host
    boundary per RL step, the host search, a generation budget that is a setting."""

    is_host = True


def bind(task: Task, tokenizer: Tokenizer) -> BoundTask:
    """`task` bound to `tokenizer`, of its kind: `task.bound_type(task, tokenizer)` when the
    task names one (an environment's `EnvTask`), else a `GraphTask` or a `HostTask`."""
    make = task.bound_type or (HostTask if task.is_host else GraphTask)
    return make(task, tokenizer)


def for_kind(table: Mapping[type, Entry], task: BoundTask) -> Entry:
    """`table`'s entry ({kind: value}) for `task`: its own type's, else its nearest base's (an
    `EnvTask` without an entry of its own takes `HostTask`'s)."""
    for kind in type(task).__mro__:
        if kind in table:
            return table[kind]
    raise TypeError(f"task {getattr(task, 'name', task)!r} is a {type(task).__name__}, none of "
                    f"{', '.join(k.__name__ for k in table)}; bind it with "
                    "vpo.tasks.bound.bind(task, tokenizer)")


def seq_len_for(task: BoundTask, records: Sequence[Record], num_answers: int, *,
                num_parents: int = 0) -> int:
    """Positions a policy needs on `records`: the longest prompt + the m-answer budget, and with
    `num_parents` > 0 the longest search mutation prompt + the budget: for symbol tasks the
    in-graph mutation prompt; for host-scored tasks the text one, each parent an answer of up
    to the budget (the bound `vpo.search.host` checks)."""
    T = task.completion_len(num_answers)
    need = task.prompt_arrays(records, num_answers)[0].shape[1] + T
    if num_parents and task.is_host:
        empty = [("", [0.0] * task.num_rewards)] * num_parents
        head = max(len(task.tokenizer.prompt_ids(mutation_text(task.task, r, empty,
                                                                 num_answers)))
                   for r in records)
        need = max(need, head + num_parents * T + T)
    elif num_parents and task.has_mutation_demonstrations:
        head = task.mutation_heads(records)[0].shape[1]
        need = max(need, task.mutation_prompt_len(head, num_parents, num_answers) + T)
    return need


