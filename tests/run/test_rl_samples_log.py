"""What the model wrote, logged: rows of prompts, completions and reward vectors equal to the
task's host scorer; samples.jsonl on resume keeps only the steps a resumed run will not redo."""

import json
import pathlib
import types

import numpy as np

from vpo.run.samples_log import JSONL, SampleLog, one_line, sample_rows
from vpo.tasks import make_task
from vpo.tasks.answers import format_answers
from vpo.tasks.bound import bind
from vpo.tasks.words import task_word_tokenizer


def _read(path) -> str:
    return pathlib.Path(path).read_text()

def test_rows_hold_the_text_and_the_host_scores():
    raw = make_task("bandit")
    task = bind(raw, task_word_tokenizer(raw))
    records = task.make_problems(0, 2)
    rng = np.random.default_rng(0)
    good = task.demonstration_ids(records[1], rng, 2)
    bad = task.tokenizer.encode("nothing here") + [task.tokenizer.eos_id]
    T = max(len(good), len(bad))
    tokens_GT = np.full((2, T), task.tokenizer.pad_id, np.int32)
    mask_GT = np.zeros((2, T), bool)
    for g, ids in enumerate([good, bad]):
        tokens_GT[g, :len(ids)], mask_GT[g, :len(ids)] = ids, True
    prompt_P, pmask_P = task.prompt_arrays([records[1]], 2)
    batch = {"prompt_BP": prompt_P, "prompt_mask_BP": pmask_P,
             "problems": {"index": np.array([1])}}
    roll = types.SimpleNamespace(tokens_BGT=tokens_GT[None], mask_BGT=mask_GT[None])
    rows = sample_rows(task, records, batch, roll, 2)
    want, valid = task.host_score([records[1]] * 2, tokens_GT, mask_GT, 2)
    assert len(rows) == 2
    assert rows[0]["valid"] == valid[0].tolist() and all(rows[0]["valid"])
    np.testing.assert_allclose(rows[0]["rewards"], np.round(want[0], 4))
    assert rows[0]["completion"].strip().startswith(format_answers(rows[0]["answers"])[:10])
    assert rows[1]["valid"] == [False, False] and rows[1]["score"] == 0.0
    assert rows[0]["score"] == max(np.asarray(rows[0]["rewards"]) @ task.eval_weights_R)
    assert rows[0]["prompt"].strip()


def test_one_line_is_short_and_single():
    row = {"completion": "a\nb " + "x" * 500, "score": 0.5}
    line = one_line(row, width=40)
    assert "\n" not in line and line.startswith("score 0.50 | a b") and line.endswith("...")


def test_resume_keeps_earlier_steps_and_drops_a_torn_line(tmp_path):
    log = SampleLog(str(tmp_path), tensorboard=False)
    for step in (10, 20, 30):
        log.write(step, [{"completion": f"s{step}", "score": 0.0}])
    log.close()
    with open(tmp_path / JSONL, "a") as f:
        f.write('{"step": 40, "compl')  # what a kill leaves
    log = SampleLog(str(tmp_path), resume_from=20, tensorboard=False)
    log.write(30, [{"completion": "again", "score": 1.0}])
    log.close()
    rows = [json.loads(line) for line in _read(tmp_path / JSONL).splitlines()]
    assert [(r["step"], r["completion"]) for r in rows] == [(10, "s10"), (20, "s20"),
                                                             (30, "again")]
    SampleLog(str(tmp_path), tensorboard=False).close()  # a fresh run starts a fresh file
    assert _read(tmp_path / JSONL) == ""
