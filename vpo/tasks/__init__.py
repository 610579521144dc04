"""Tasks with vector rewards: prompts, answer format, in-graph or host rewards, demonstrations.

The contract is one frozen dataclass, `vpo.tasks.base.Task`; each task module has a factory that
returns one (pass the task object around; there is no registry):

    maze.make_maze_task(size=5)           in-graph; designed-conflict grid maze, R = 4
    maze.make_paper_maze_task()           the 9x9 setting of the VPO paper
    program.make_program_task("easy")     in-graph; program synthesis from examples, R = #tests
    bandit.make_bandit_task()             in-graph; the three-armed vector bandit toy, R = 2
    arithmetic.make_arithmetic_task()     host reward on decoded text, R = 3

Shared pieces: `vocab` (word-level vocabularies and their HF tokenizer), `answers` (splitting a
generation into its m answers), `prompting` (left-padded in-graph prompt assembly),
`mutation_demos` (weaker parents for SFT on search mutation prompts).
A prompt's attention mask is `tokens_P != vocab.PAD`.
"""
