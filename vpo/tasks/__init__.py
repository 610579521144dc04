"""Tasks with vector rewards, defined over text (`vpo.tasks.base.Task`), and their binding to a
tokenizer (`vpo.tasks.bound`). `make_task(name, **kwargs)` is the one table of built-in tasks:

    maze          in-graph; designed-conflict 5x5 maze, R = 4 (`maze.make_maze_task`)
    maze9         in-graph; the 9x9 setting of the VPO paper (`maze.make_paper_maze_task`)
    program       in-graph; program synthesis from examples, R = #tests
    codeword      in-graph; a hidden code from per-position clues, R = #positions (the
                  search's positive control, `codeword.make_codeword_task`)
    bandit        in-graph; the three-armed vector bandit toy, R = 2
    arithmetic    host-scored; reach a target with + - *, R = 3
    countdown2    host-scored; reach one of two targets with + - * (no answer hits both), R = 3
    countdown2_1op  host-scored; the same with targets one operation each (a small model's), R = 2
    dataset       host-scored; a user's JSONL/Parquet file and reward functions
                  (`dataset.make_dataset_task(path, rewards, weights)`; not in TASK_NAMES)

Shared pieces: `answers` (the `<answer k>` format, read from text and from token bytes),
`mutation_demos` (weaker parents for SFT on search mutation prompts).
"""

from __future__ import annotations

TASK_NAMES = ("maze", "maze9", "program", "codeword", "bandit", "arithmetic", "countdown2",
              "countdown2_1op")


def make_task(name: str, **kwargs):
    """The built-in task `name` (see the module docstring), its factory's keyword arguments
    passed through; an unknown name is a ValueError that lists the known ones."""
    from vpo.tasks import arithmetic, bandit, codeword, countdown2, dataset, maze, program

    factories = {"maze": maze.make_maze_task, "maze9": maze.make_paper_maze_task,
                 "program": program.make_program_task,
                 "codeword": codeword.make_codeword_task, "bandit": bandit.make_bandit_task,
                 "arithmetic": arithmetic.make_arithmetic_task,
                 "countdown2": countdown2.make_countdown2_task,
                 "countdown2_1op": countdown2.make_countdown2_1op_task,
                 "dataset": dataset.make_dataset_task}
    if name not in factories:
        raise ValueError(f"task: unknown task {name!r}; choose one of {', '.join(factories)}")
    try:
        return factories[name](**kwargs)
    except TypeError as e:
        raise ValueError(f"task_kwargs for {name!r}: {e}") from None
