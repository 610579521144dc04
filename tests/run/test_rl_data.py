"""Problem pipeline: shuffling, epochs, process sharding, resumable position, JSONL records,
mutation prompts mixed in by row."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from vpo.run import data as data_lib
from vpo.tasks import make_task
from vpo.tasks.bound import bind
from vpo.tasks.words import task_word_tokenizer


def bound(name, **kw):
    task = make_task(name, **kw)
    return bind(task, task_word_tokenizer(task))


@pytest.fixture(scope="module")
def bandit():
    return bound("bandit", max_answers=4)


@pytest.fixture(scope="module")
def maze():
    return bound("maze")


def indices(it, n):
    return [next(it)["problems"]["index"].tolist() for _ in range(n)]


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


def test_batch_holds_prompts_of_its_problems(maze):
    records = maze.make_problems(0, 5)  # the pipeline's default problem set (seed 0)
    batch = next(data_lib.problem_iterator(maze, 3, 2, num_problems=5))
    P = max(len(maze.prompt_ids(r, 2)) for r in records)
    assert batch["prompt_BP"].shape == (3, P)
    assert batch["prompt_BP"].dtype == np.int32 and batch["prompt_mask_BP"].dtype == bool
    assert set(batch["problems"]) == {"index", "task"}
    for b in range(3):
        i = int(batch["problems"]["index"][b])
        ids = maze.prompt_ids(records[i], 2)
        np.testing.assert_array_equal(batch["prompt_BP"][b, P - len(ids):], ids)
        np.testing.assert_array_equal(batch["prompt_mask_BP"][b], np.arange(P) >= P - len(ids))
        assert not batch["prompt_BP"][b, :P - len(ids)].any()  # the pad id (0) on the left
        want = maze.task.arrays([records[i]])
        got = jax.tree.map(lambda x, b=b: x[b], batch["problems"]["task"])
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_array_equal(g, w[0])
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


def test_jsonl_records_load_and_errors(tmp_path, maze):
    task = bound("arithmetic")
    good = tmp_path / "good.jsonl"
    good.write_text('{"numbers": [3, 4, 5], "target": 35}\n\n{"numbers": [1, 2, 3], "target": 6}\n')
    records = data_lib.load_jsonl_records(str(good), task)
    assert records == [{"numbers": [3, 4, 5], "target": 35}, {"numbers": [1, 2, 3], "target": 6}]
    assert data_lib.load_jsonl_records(str(good)) == records
    batch = next(data_lib.problem_iterator(task, 2, 1, records=records))
    assert set(batch["problems"]) == {"index"}  # a host task: the graph sees the index only
    assert sorted(records[i]["target"] for i in batch["problems"]["index"]) == [6, 35]
    for b in range(2):
        text = task.tokenizer.decode(batch["prompt_BP"][b][batch["prompt_mask_BP"][b]])
        r = records[int(batch["problems"]["index"][b])]
        assert " ".join(map(str, r["numbers"])) in text and f"reach {r['target']}" in text

    cases = {
        '{"numbers": [3, 4, 5]}': r"bad.jsonl:2: arithmetic cannot read this problem: missing "
                                  r"field 'target'",
        "[3, 4, 5]": r"bad.jsonl:2: expected a JSON object, got list",
        "{not json": r"bad.jsonl:2: not valid JSON",
    }
    for row, msg in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"numbers": [3, 4, 5], "target": 35}\n' + row + "\n")
        with pytest.raises(ValueError, match=msg):
            data_lib.load_jsonl_records(str(bad), task)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no problems"):
        data_lib.load_jsonl_records(str(empty))
    # in-graph tasks: the record must also give the task's arrays
    grid = tmp_path / "maze.jsonl"
    grid.write_text(json.dumps(maze.make_problems(0, 1)[0]) + "\n" + '{"grid": 3}\n')
    with pytest.raises(ValueError, match=r"maze.jsonl:2: grid: expected list .* got int 3"):
        data_lib.load_jsonl_records(str(grid), maze)


def test_mutation_prompts_mixed_in_by_row_and_resumable(maze):
    kw = dict(num_problems=16, seed=3, mutation_fraction=0.5, mutation_parents=2)
    records = maze.make_problems(3, 16)
    mutation, mmask = data_lib.mutation_prompt_arrays(maze, records, 2, 2, seed=3)
    plain, pmask = maze.prompt_arrays(records, 2)
    assert mutation.shape[0] == 16 and mutation.shape[1] > plain.shape[1]
    P2 = mutation.shape[1]
    tables = data_lib.prompt_tables(maze, records, 2, mutation_fraction=0.5, seed=3)
    assert tables.prompt_len == P2
    it = data_lib.problem_iterator(maze, 8, 2, **kw)
    kinds = []
    for _ in range(4):
        batch = next(it)
        assert batch["prompt_BP"].shape == (8, P2)
        np.testing.assert_array_equal(batch["prompt_mask_BP"], batch["prompt_BP"] != 0)
        for b in range(8):
            j = int(batch["problems"]["index"][b])
            row, mask = batch["prompt_BP"][b], batch["prompt_mask_BP"][b]
            if np.array_equal(row, mutation[j]):
                np.testing.assert_array_equal(mask, mmask[j])
                assert "Earlier answers and their scores" in maze.tokenizer.decode(row[mask])
                kinds.append("mutation")
            else:  # the plain prompt, left-padded to P2
                n = plain.shape[1]
                np.testing.assert_array_equal(row[P2 - n:], plain[j])
                np.testing.assert_array_equal(mask[P2 - n:], pmask[j])
                assert not row[:P2 - n].any() and not mask[:P2 - n].any()
                kinds.append("plain")
    assert 8 <= kinds.count("mutation") <= 24  # 32 rows at rate 0.5
    state = it.get_state()
    expected = next(it)["prompt_BP"]
    # resumed with the tables given precomputed (as `vpo.run.loop.train` passes them): same coins
    it2 = data_lib.problem_iterator(maze, 8, 2, records=records, tables=tables, **kw)
    it2.set_state(state)
    np.testing.assert_array_equal(next(it2)["prompt_BP"], expected)


def test_mutation_prompts_need_an_in_graph_task():
    with pytest.raises(ValueError, match="mutation_fraction"):
        data_lib.problem_iterator(bound("arithmetic"), 4, 1, num_problems=8,
                                  mutation_fraction=0.5)


def test_fewer_rows_than_a_batch_print_a_one_line_notice(bandit, capsys):
    """2 rows for a batch of 8: each batch draws each row 4 times, said once on stderr."""
    it = data_lib.problem_iterator(bandit, 8, 1, records=bandit.make_problems(0, 2))
    assert sorted(next(it)["problems"]["index"].tolist()) == [0] * 4 + [1] * 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("notice: 2 problem row(s) for a batch of 8 ")
    assert "about 4 times" in err and "train.batch_size to 2 or fewer" in err
    data_lib.problem_iterator(bandit, 8, 1, records=bandit.make_problems(0, 8))
    assert capsys.readouterr().err == ""
