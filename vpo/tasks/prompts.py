"""The prompt text of a task: the user message for m answers in numbered tags, and the search
mutation prompt that shows scored parents (the tokenizer's chat template wraps both).

    <statement>
    Give 3 different answers, <answer 1> ... </answer 1> to <answer 3> ... </answer 3>, each <hint>.

    <statement>
    Earlier answers and their scores (completion, gold, diamond, avoid_lava):
    Answer 1: U R R D | scores: 1.0 0.5 0.0 1.0
    Give 3 better answers, <answer 1> ... </answer 1> to <answer 3> ... </answer 3>, each <hint>.

A task whose component i scores symbol i (`Task.scores_per_symbol`, codeword) writes each
symbol's score beside it: `Answer 1: 1h 0.0 2a 1.0 3h 0.0`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vpo.tasks.base import Record, Task


def answer_instruction(task: Task, num_answers: int, *, better: bool = False) -> str:
    """The line that asks for m answers in tags (see the module docstring); a `tagless_single`
    task's one better answer is the whole completion, so it asks without tags."""
    m = num_answers
    if m == 1 and better and task.tagless_single:
        return "Give a better answer. Reply with the answer only."
    if m == 1:
        what = "a better answer" if better else "one answer"
        return f"Give {what}, <answer 1> ... </answer 1>, with {task.answer_hint} inside."
    kind = "better" if better else "different"
    return (f"Give {m} {kind} answers, <answer 1> ... </answer 1> to "
            f"<answer {m}> ... </answer {m}>, each {task.answer_hint}.")


def prompt_text(task: Task, record: Record, num_answers: int) -> str | list[dict[str, str]]:
    """The user message of a plain prompt: the statement, then the answer instruction. A
    statement given as chat messages gets the instruction appended to its last (user) message;
    a `tagless_single` task with m = 1 sends the statement as written."""
    statement = task.statement(record)
    if task.tagless_single and num_answers == 1:
        return statement
    instruction = answer_instruction(task, num_answers)
    if isinstance(statement, str):
        return f"{statement}\n{instruction}"
    last = statement[-1]
    return [*statement[:-1], {**last, "content": f"{last['content']}\n{instruction}"}]


def parents_header(task: Task) -> str:
    return f"\nEarlier answers and their scores ({', '.join(task.reward_names)}):"


def parent_line(k: int, answer: str, rewards_R: Sequence[float], per_symbol: bool = False
                ) -> str:
    """One parent of a mutation prompt: its answer, then its scores in tenths; `per_symbol`:
    each answer word followed by its own component's score."""
    if per_symbol:
        pairs = "".join(f" {w} {tenths(v) / 10:.1f}"
                        for w, v in zip(answer.split(), rewards_R, strict=False))
        return f"\nAnswer {k}:{pairs}"
    scores = "".join(f" {tenths(v) / 10:.1f}" for v in rewards_R)
    return f"\nAnswer {k}: {answer} | scores:{scores}"


def tenths(v: float) -> int:
    # in float32 as the in-graph `mutation_prompt` rounds, so half-way cases (0.35) agree
    return int(np.clip(np.round(np.float32(v) * np.float32(10.0)), 0, 10))


def mutation_text(task: Task, record: Record, parents: Sequence[tuple[str, Sequence[float]]],
                  num_answers: int) -> str | list[dict[str, str]]:
    """The user message of a search mutation prompt: the parents (answer text, rewards_R) with
    their scores in tenths, then the request for m better answers. A statement given as chat
    messages gets both appended to its last (user) message."""
    lines = "".join(parent_line(k, a, r, task.scores_per_symbol)
                    for k, (a, r) in enumerate(parents, 1))
    tail = f"{parents_header(task)}{lines}\n{answer_instruction(task, num_answers, better=True)}"
    statement = task.statement(record)
    if isinstance(statement, str):
        return statement + tail
    last = statement[-1]
    return [*statement[:-1], {**last, "content": last["content"] + tail}]
