"""The task contract, over text: one frozen dataclass of data and pure functions (no subclassing,
no registry). Tokenizers never appear here; `vpo.tasks.bound.bind(task, tokenizer)` turns a
task into token arrays and in-graph functions for one tokenizer.

A problem is a JSON-able record (a dict). A generation holds m answers in numbered tags,
`<answer 1> ... </answer 1>` ... (`vpo.tasks.answers`); missing, empty, truncated, malformed and
duplicate answers are invalid slots (zero reward row, masked), never errors.

Dimension key (as in `vpo.types`): N problems, M answers per generation, A symbols per answer, R
reward components, Q parents in a mutation prompt.

Tasks whose answers are words of a fixed alphabet (`symbols`: maze moves, program tokens, bandit
arms) also score in the graph: `arrays(records)` gives each problem as numeric arrays, and
`symbol_reward(problem, symbols_A, mask_A) -> rewards_R` is the pure-jnp twin of `score` for one
well-formed answer (symbol ids into `symbols`, at most A = `answer_len` of them). Tasks without
`symbol_reward` (arithmetic, a user's reward functions) score on the host once per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Record = dict[str, Any]  # one problem, JSON-able
# a record's index in its file or in an environment's problems (not passed to reward
# functions; errors name rows by it)
ROW = "_row"


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """A task with vector rewards in [0, 1]^R (higher is better).

    Fields:
      name: short identifier (logs, file names).
      reward_names: names of the R reward components, in order.
      eval_weights_R: the fixed scalarization w* (non-negative, sums to 1): what GRPO trains on
        and what best@k scores (`score = w*ᵀ r`).
      make_problems(seed, num) -> list[Record]: deterministic in `seed`.
      statement(record) -> str | list[dict]: the problem as text, the body of every prompt (no
        leading or trailing whitespace); or, for datasets, chat messages ending with the user's.
      answer_hint: what one answer is, completing "Each answer is ...", e.g. "a route: moves
        U D L R separated by spaces".
      score(records, answers) -> (rewards_NMR float32, valid_NM bool): the host scorer, batched.
        `answers[n][m]` is the text inside slot m's tags (stripped), or None when the slot is
        missing / empty / truncated. The task marks malformed answers and later duplicates of an
        earlier valid answer invalid (zero rows).
      solved(rewards_R) -> bool: predicate counted by pass@k (jnp; numpy inputs work too).
      demonstrations(record, rng, num_answers) -> list[str]: `num_answers` distinct valid answer
        texts for SFT (diverse: e.g. maze routes via gold, via diamonds, via the bonus tile).
      symbols: the answer alphabet of in-graph tasks (an answer is 1..answer_len of these words
        separated by whitespace); None for host-only tasks.
      answer_len: A, the most symbols in one answer (in-graph tasks); also bounds the generation
        budget (see `vpo.tasks.bound`).
      arrays(records) -> pytree of numpy arrays with a leading N axis: the problems for
        `symbol_reward` (in-graph tasks).
      symbol_reward(problem, symbols_A int32, mask_A bool) -> rewards_R float32: pure jnp, ONE
        problem (the `arrays` pytree without its N axis) and one well-formed answer; callers vmap.
        Must equal `score` on the same answer.
      mutation_demonstrations(record, rng, num_parents, num_answers) -> (parents, children):
        answer texts for SFT on search mutation prompts: 1..num_parents weaker parents and
        num_answers distinct improved children (None: the task has none).
      words: words beyond those of its prompts' fixed text that the task's texts can contain
        (numbers, grid symbols); the built-in word-level tokenizer is built from them.
      max_answers: the most answers one generation may be asked for.
      tagless_single: with m = 1, send the statement as written and read the whole completion
        as the answer (no tags; user datasets, as in TRL).
      cover_components: reward components a SET of candidates must each hit (reach 1 in some
        valid candidate) to cover a problem, for tasks whose modes no single answer joins
        (countdown2: both targets); evaluation then reports cover@k. () for tasks without.
      score_applies(records, answers) -> (rewards_NMR, valid_NM, applies_NMR bool): `score`
        with, per component, False where it does not apply to a valid answer (a reward function
        returned None: TRL's multi-task idiom); None: every component applies to every answer.
      bound_type(task, tokenizer) -> the bound task `vpo.tasks.bound.bind` makes, of this
        task's kind (an environment's `vpo.env.task.EnvTask`, with its episode settings); None:
        a `GraphTask` for a task with `symbol_reward`, else a `HostTask`.
      scores_per_symbol: reward component i scores the answer's i-th symbol (R = answer_len,
        codeword's positions); the search's mutation prompt then writes each parent symbol
        with its own score beside it (`vpo.tasks.prompts.parent_line`), the feedback where it
        applies, instead of one list of scores after the answer.
    """

    name: str
    reward_names: tuple[str, ...]
    eval_weights_R: np.ndarray
    make_problems: Callable[[int, int], list[Record]]
    statement: Callable[[Record], str | list[dict[str, str]]]
    answer_hint: str
    score: Callable[[Sequence[Record], Sequence[Sequence[str | None]]],
                    tuple[np.ndarray, np.ndarray]]
    solved: Callable[[Any], Any]
    demonstrations: Callable[..., list[str]]
    symbols: tuple[str, ...] | None = None
    answer_len: int = 0
    arrays: Callable[[Sequence[Record]], Any] | None = None
    symbol_reward: Callable[..., Any] | None = None
    mutation_demonstrations: Callable[..., tuple[list[str], list[str]]] | None = None
    words: tuple[str, ...] = ()
    max_answers: int = 8
    tagless_single: bool = False
    score_applies: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    cover_components: tuple[int, ...] = ()
    bound_type: Callable[..., Any] | None = None
    scores_per_symbol: bool = False

    def __post_init__(self):
        w = np.asarray(self.eval_weights_R, np.float32)
        object.__setattr__(self, "eval_weights_R", w)
        R = len(self.reward_names)
        if w.shape != (R,):
            raise ValueError(f"{self.name}: eval_weights_R has shape {w.shape} but reward_names "
                             f"has {R} entries; give one weight per reward component")
        if np.any(w < 0) or not np.isclose(w.sum(), 1.0, atol=1e-5):
            raise ValueError(f"{self.name}: eval_weights_R must be non-negative and sum to 1; "
                             f"got {w.tolist()}")
        graph = (self.symbols is not None, self.arrays is not None,
                 self.symbol_reward is not None)
        if any(graph) and not all(graph):
            raise ValueError(f"{self.name}: in-graph scoring needs all of symbols, arrays and "
                             "symbol_reward (or none of them for a host-scored task)")
        if self.symbols is not None:
            if self.answer_len < 1:
                raise ValueError(f"{self.name}: answer_len must be >= 1; got {self.answer_len}")
            bad = [s for s in self.symbols if not s or any(c.isspace() or c in "<>" for c in s)
                   or not s.isascii()]
            if bad or len(set(self.symbols)) != len(self.symbols):
                raise ValueError(f"{self.name}: symbols must be distinct non-empty ASCII words "
                                 f"without whitespace or < >; got {bad or self.symbols}")
        if self.scores_per_symbol and (self.symbols is None or self.answer_len != R):
            raise ValueError(f"{self.name}: scores_per_symbol needs a symbol task with one "
                             f"reward component per answer symbol (R = {R}, answer_len = "
                             f"{self.answer_len})")
        if not 1 <= self.max_answers <= 9:
            raise ValueError(f"{self.name}: max_answers must be in 1..9 (one-digit answer "
                             f"tags); got {self.max_answers}")

    @property
    def num_rewards(self) -> int:
        """R."""
        return len(self.reward_names)

    @property
    def is_host(self) -> bool:
        """True when rewards need Python on decoded text (one host boundary per RL step)."""
        return self.symbol_reward is None

    def check_num_answers(self, num_answers: int) -> None:
        """Raise a ValueError naming `num_answers` when it is outside 1..max_answers."""
        if not 1 <= num_answers <= self.max_answers:
            raise ValueError(f"{self.name}: num_answers={num_answers} must be in 1.."
                             f"{self.max_answers}; build the task with a larger max_answers")


def check_symbol_rewards(task: Task, rewards_NR: Any, n: int) -> None:
    """`symbol_reward`'s output for n answers (vmapped: [n, R]) checked at trace time, where its
    shape and dtype are known: a `RewardError` naming the task, the function and the shape one
    answer must give (its values are traced: a non-finite one makes that group's advantages NaN,
    and the step skips the update)."""
    from vpo.errors import RewardError

    R = task.num_rewards
    fix = (f"symbol_reward(problem, symbols_A, mask_A) must return one float per reward "
           f"component for ONE answer: shape ({R},), ({', '.join(task.reward_names)})")
    if not hasattr(rewards_NR, "shape") or not hasattr(rewards_NR, "dtype"):
        raise RewardError(f"task {task.name!r}: symbol_reward returned {type(rewards_NR).__name__}"
                          f", not an array; {fix} (jnp.stack a list)")
    if tuple(rewards_NR.shape) != (n, R):
        raise RewardError(f"task {task.name!r}: symbol_reward returned shape "
                          f"{tuple(rewards_NR.shape)[1:]} for one answer; {fix}")
    if not (np.issubdtype(rewards_NR.dtype, np.floating) or np.issubdtype(rewards_NR.dtype,
                                                                          np.integer)
            or rewards_NR.dtype == bool):
        raise RewardError(f"task {task.name!r}: symbol_reward returned dtype {rewards_NR.dtype}; "
                          f"{fix}")


def check_score_output(task: Task, out: Any, records: Sequence[Record], num_answers: int, *,
                       applies: bool = False) -> tuple[np.ndarray, ...]:
    """`score`'s (or `score_applies`') return for `records` × `num_answers` slots as
    (rewards_NMR float32, valid_NM bool[, applies_NMR bool]), or a `RewardError` naming the task,
    the function, what it returned and the shapes expected; a non-finite reward of a valid answer
    names the problem and its answer slot."""
    from vpo.errors import RewardError

    fn = "score_applies" if applies else "score"
    N, M, R = len(records), num_answers, task.num_rewards
    want = ((N, M, R), (N, M)) + (((N, M, R),) if applies else ())
    names = ("rewards_NMR", "valid_NM", "applies_NMR")[:len(want)]
    shapes = ", ".join(f"{n} {s}" for n, s in zip(names, want, strict=True))
    fix = (f"task {task.name!r}: {fn}(records, answers) for {N} problems x {M} answer slots "
           f"must return ({shapes}), R = {R} ({', '.join(task.reward_names)})")
    if not isinstance(out, (tuple, list)) or len(out) != len(want):
        raise RewardError(f"{fix}; it returned {_short_value(out)}")
    if N == 0:  # nothing to score: the slot count of an empty batch is the caller's
        return tuple(np.zeros(w, np.float32 if i == 0 else bool) for i, w in enumerate(want))
    arrays = []
    for name, x, shape in zip(names, out, want, strict=True):
        try:
            a = np.asarray(x, np.float32 if name == "rewards_NMR" else bool)
        except (TypeError, ValueError) as e:
            raise RewardError(f"{fix}; its {name} is not numeric ({type(e).__name__}: {e}): "
                              f"{_short_value(x)}") from None
        if a.shape != shape:
            raise RewardError(f"{fix}; its {name} has shape {a.shape}")
        arrays.append(a)
    bad = arrays[1][..., None] & ~np.isfinite(arrays[0])
    if bad.any():
        n, m, r = (int(i) for i in np.argwhere(bad)[0])
        raise RewardError(f"task {task.name!r}: {fn} gave a non-finite reward "
                          f"{arrays[0][n, m, r]} for component {task.reward_names[r]!r} of "
                          f"answer slot {m + 1} of problem {_short_value(records[n])}; return "
                          "finite values in [0, 1] (an invalid answer: valid False, zero row)")
    return tuple(arrays)


def _short_value(x: Any, limit: int = 120) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit] + "..."


def symbol_words(answer: str | None, symbols: Sequence[str], answer_len: int
                 ) -> list[str] | None:
    """The words of one answer if it is well formed for a symbol alphabet, else None.

    Words are split as the in-graph reader splits them (`vpo.tasks.answers.answer_words`);
    an answer is well formed iff it has 1..answer_len words and each is in `symbols`.
    """
    from vpo.tasks.answers import answer_words

    if answer is None:
        return None
    words = answer_words(answer)
    if not 1 <= len(words) <= answer_len or any(w not in symbols for w in words):
        return None
    return words


def score_symbol_answers(records: Sequence[Record], answers: Sequence[Sequence[str | None]],
                         symbols: Sequence[str], answer_len: int, num_rewards: int,
                         reward_fn: Callable[[Record, list[str]], Sequence[float]]
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The host `score` of a symbol task from a plain-Python reward of one well-formed answer
    (`reward_fn(record, words) -> R floats`): malformed slots and later duplicates of an earlier
    valid answer (same words) are invalid, with zero rows."""
    return score_word_answers(records, answers, num_rewards, reward_fn,
                              lambda answer: symbol_words(answer, symbols, answer_len))


def score_word_answers(records: Sequence[Record], answers: Sequence[Sequence[str | None]],
                       num_rewards: int,
                       reward_fn: Callable[[Record, list[str]], Sequence[float]],
                       words_of: Callable[[str | None], list[str] | None]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The host `score` of a task whose answers are read as words: `words_of(slot text)` gives
    an answer's words or None (missing, empty, too long: an invalid slot); a later duplicate of
    an earlier valid answer (same words) is invalid too; invalid slots keep zero rows, valid ones
    get `reward_fn(record, words)` → (rewards_NMR float32, valid_NM bool)."""
    N = len(records)
    M = max((len(a) for a in answers), default=0)
    rewards = np.zeros((N, M, num_rewards), np.float32)
    valid = np.zeros((N, M), bool)
    for n, (record, slots) in enumerate(zip(records, answers, strict=True)):
        seen: list[list[str]] = []
        for m, answer in enumerate(slots):
            words = words_of(answer)
            if words is None or words in seen:
                continue
            seen.append(words)
            valid[n, m] = True
            rewards[n, m] = reward_fn(record, words)
    return rewards, valid
