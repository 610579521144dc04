"""Problem pipeline: shuffling, epochs, process sharding, resumable position, JSONL loading."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from vpo import data as data_lib
from vpo.tasks.arithmetic import make_arithmetic_task
from vpo.tasks.bandit import make_bandit_task
from vpo.tasks.maze import make_maze_task


@pytest.fixture(scope="module")
def bandit():
    return make_bandit_task(max_answers=4)


def indices(it, n):
    return [next(it)["problems"].index.tolist() for _ in range(n)]


def test_batches_shuffle_every_epoch_and_cover_all(bandit):
    it = data_lib.problem_iterator(bandit, 4, 2, num_problems=8, seed=0)
    b = indices(it, 6)  # 3 epochs of 8 problems
    for e in range(3):
        assert sorted(b[2 * e] + b[2 * e + 1]) == list(range(8))
    assert b[0:2] != b[2:4]  # reshuffled
    again = indices(data_lib.problem_iterator(bandit, 4, 2, num_problems=8, seed=0), 6)
    assert again == b
    other = indices(data_lib.problem_iterator(bandit, 4, 2, num_problems=8, seed=1), 2)
    assert other != b[:2]


def test_batch_holds_prompts_of_its_problems():
    maze = make_maze_task()
    batch = next(data_lib.problem_iterator(maze, 3, 2, num_problems=5))
    assert batch["prompt_BP"].shape == (3, maze.prompt_len)
    assert batch["prompt_BP"].dtype == np.int32 and batch["prompt_mask_BP"].dtype == bool
    for b in range(3):
        problem = jax.tree.map(lambda x: x[b], batch["problems"])
        np.testing.assert_array_equal(batch["prompt_BP"][b], maze.prompt_tokens(problem, 2))
    assert batch["prompt_mask_BP"][:, -1].all()


def test_state_round_trip_resumes_the_stream(bandit):
    it = data_lib.problem_iterator(bandit, 4, 1, num_problems=8)
    indices(it, 3)
    state = it.get_state()
    assert json.loads(json.dumps(state)) == state
    expected = indices(it, 4)
    it2 = data_lib.problem_iterator(bandit, 4, 1, num_problems=8)
    it2.set_state(state)
    assert indices(it2, 4) == expected


def test_processes_get_disjoint_shards(bandit, monkeypatch):
    """Two processes feed contiguous halves of the one-process global batches."""
    single = indices(data_lib.problem_iterator(bandit, 4, 1, num_problems=8), 2)
    per_process = []
    for pid in range(2):
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(jax, "process_index", lambda pid=pid: pid)
        it = data_lib.problem_iterator(bandit, 4, 1, num_problems=8)
        per_process.append(indices(it, 2))  # one epoch: 2 batches of 2 per process
    seen = [sum(b, []) for b in per_process]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(8))
    assert [a + b for a, b in zip(*per_process, strict=True)] == single
    with pytest.raises(ValueError, match="batch_size"):
        data_lib.problem_dataset(bandit, 3, 1, num_problems=8)


def test_jsonl_problems_load_and_errors(tmp_path):
    task = make_arithmetic_task()
    good = tmp_path / "good.jsonl"
    good.write_text('{"numbers": [3, 4, 5], "target": 35}\n\n{"numbers": [1, 2, 3], "target": 6}\n')
    problems = data_lib.load_jsonl_problems(str(good), task)
    np.testing.assert_array_equal(problems.numbers, [[3, 4, 5], [1, 2, 3]])
    np.testing.assert_array_equal(problems.target, [35, 6])
    batch = next(data_lib.problem_iterator(task, 2, 1, problems=problems))
    assert sorted(batch["problems"].target.tolist()) == [6, 35]

    cases = {
        '{"numbers": [3, 4, 5]}': r"bad.jsonl:2: missing field 'target'",
        '{"numbers": [3, 4], "target": 1}': r"bad.jsonl:2: field 'numbers' has shape",
        '{"numbers": [3, 4, 5], "target": "x"}': r"bad.jsonl:2: field 'target'",
        "{not json": r"bad.jsonl:2: not valid JSON",
    }
    for row, msg in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"numbers": [3, 4, 5], "target": 35}\n' + row + "\n")
        with pytest.raises(ValueError, match=msg):
            data_lib.load_jsonl_problems(str(bad), task)


def test_mutation_prompts_mixed_in_by_row_and_resumable():
    maze = make_maze_task()
    P2 = maze.mutation_prompt_len(2)
    kw = dict(num_problems=16, seed=3, mutation_fraction=0.5, mutation_parents=2)
    all_problems = maze.make_problems(3, 16)
    mutation, _ = data_lib.mutation_prompt_arrays(maze, all_problems, 2, 2, seed=3)
    assert mutation.shape == (16, P2)
    it = data_lib.problem_iterator(maze, 8, 2, **kw)
    kinds = []
    for _ in range(4):
        batch = next(it)
        assert batch["prompt_BP"].shape == (8, P2)
        np.testing.assert_array_equal(batch["prompt_mask_BP"], batch["prompt_BP"] != 0)
        for b in range(8):
            problem = jax.tree.map(lambda x: x[b], batch["problems"])
            row = batch["prompt_BP"][b]
            plain = np.asarray(maze.prompt_tokens(problem, 2))
            same = [j for j in range(16) if all(  # the generator may repeat a maze
                np.array_equal(np.asarray(x)[j], np.asarray(y))
                for x, y in zip(all_problems, problem, strict=True))]
            assert same
            if any(np.array_equal(row, mutation[j]) for j in same):
                kinds.append("mutation")
            else:  # the plain prompt, left-padded to P2
                np.testing.assert_array_equal(row[P2 - plain.size:], plain)
                assert not row[:P2 - plain.size].any()
                kinds.append("plain")
    assert 8 <= kinds.count("mutation") <= 24  # 32 rows at rate 0.5
    state = it.get_state()
    expected = next(it)["prompt_BP"]
    it2 = data_lib.problem_iterator(maze, 8, 2, **kw)
    it2.set_state(state)
    np.testing.assert_array_equal(next(it2)["prompt_BP"], expected)


def test_mutation_prompts_need_an_in_graph_task():
    with pytest.raises(ValueError, match="mutation_fraction"):
        data_lib.problem_iterator(make_arithmetic_task(), 4, 1, num_problems=8,
                                  mutation_fraction=0.5)
