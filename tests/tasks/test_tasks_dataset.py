"""A user's dataset + reward functions as a task: JSONL and Parquet rows, text and chat-message
prompts through the checkpoint's chat template, m = 1 as written vs m answers in tags, invalid
and duplicate answers never reach the functions, bad rows named."""

import json
import os

import numpy as np
import pytest

from vpo.io.tokenizer import load_tokenizer
from vpo.tasks import make_task
from vpo.tasks.bound import bind

BPE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")

REWARDS = '''
CALLS = []

def text(c):  # a chat prompt's completion is TRL's [{"role": "assistant", "content": ...}]
    return c if isinstance(c, str) else c[0]["content"]

def correct(prompts, completions, answer, **kw):
    CALLS.append(list(completions))
    return [1.0 if a in text(c) else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, **kw):
    return [max(0.0, 1.0 - len(text(c)) / 10) for c in completions]
'''

ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5", "completion": "5"},
    {"prompt": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 4 + 4?"}], "answer": "8",
     "completion": "8"},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "rewards.py").write_text(REWARDS)
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return d


@pytest.fixture(scope="module")
def task(files):
    t = make_task("dataset", path=str(files / "rows.jsonl"),
                  rewards=[f"{files}/rewards.py:correct", f"{files}/rewards.py:short"],
                  weights=[3, 1])
    return bind(t, load_tokenizer(BPE))


def test_components_weights_and_records(task):
    assert task.name == "rows" and task.reward_names == ("correct", "short")
    np.testing.assert_allclose(task.eval_weights_R, [0.75, 0.25])
    assert task.is_host
    records = task.make_problems(0, 10)
    assert [r["answer"] for r in records] == ["5", "8"] and [r["_row"] for r in records] == [0, 1]


def test_prompts_use_the_chat_template(task):
    tok = task.tokenizer
    r0, r1 = task.make_problems(0, 2)
    # m = 1: the prompt as written (text or messages), through the template
    assert task.prompt_ids(r0, 1) == tok.prompt_ids(ROWS[0]["prompt"])
    assert task.prompt_ids(r1, 1) == tok.prompt_ids(ROWS[1]["prompt"])
    assert "Be brief." in tok.decode(task.prompt_ids(r1, 1), skip_special_tokens=False)
    # m = 2: the answer instruction joins the last user message
    text = tok.decode(task.prompt_ids(r1, 2), skip_special_tokens=False)
    assert "What is 4 + 4?\nGive 2 different answers, <answer 1>" in text
    assert text.index("Be brief.") < text.index("What is 4 + 4?")


def test_scores_reach_functions_only_for_valid_answers(task, files):
    import sys

    mod = next(m for n, m in sys.modules.items() if n.startswith("vpo_rewards_")
               and getattr(m, "__file__", "") == str(files / "rewards.py"))
    mod.CALLS.clear()
    records = task.make_problems(0, 2)
    rewards, valid = task.task.score(records, [["5", None, " 5 "], ["", "eight", "8"]])
    # one batched call; empty, missing, duplicate out; row 1's chat prompt: message lists
    assert mod.CALLS == [["5", [{"role": "assistant", "content": "eight"}],
                          [{"role": "assistant", "content": "8"}]]]
    assert valid.tolist() == [[True, False, False], [False, True, True]]
    np.testing.assert_allclose(rewards[0, 0], [1.0, 0.9])
    np.testing.assert_allclose(rewards[1, 1], [0.0, 0.5])
    np.testing.assert_allclose(rewards[1, 2], [1.0, 0.9])
    assert not rewards[~valid].any()


def test_host_score_reads_generated_text(task):
    tok = task.tokenizer
    records = task.make_problems(0, 2)
    m1 = [tok.encode("It is 5") + [tok.eos_id], tok.encode("nine") + [tok.eos_id]]
    m2 = [task.answers_ids(["5", "6"]), task.answers_ids(["8", "8"])]
    for m, ids in ((1, m1), (2, m2)):
        T = max(len(x) for x in ids)
        tokens = np.array([x + [tok.pad_id] * (T - len(x)) for x in ids], np.int32)
        mask = np.array([[True] * len(x) + [False] * (T - len(x)) for x in ids])
        rewards, valid = task.host_score(records, tokens, mask, m)
        assert rewards.shape == (2, m, 2)
        if m == 1:  # the whole completion is the answer
            np.testing.assert_allclose(rewards[:, 0, 0], [1.0, 0.0])
        else:
            assert valid.tolist() == [[True, True], [True, False]]  # the repeated "8" masked
            np.testing.assert_allclose(rewards[:, 0, 0], [1.0, 1.0])
    assert task.answers_ids(["5"]) == tok.encode("5") + [tok.eos_id]  # SFT target, m = 1


def test_parquet_rows_read_like_jsonl(files, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": r["prompt"] if isinstance(r["prompt"], str) else "x", "answer": r["answer"]}
            for r in ROWS]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    t = make_task("dataset", path=str(tmp_path / "rows.parquet"),
                  rewards=[f"{files}/rewards.py:correct"])
    assert [r["answer"] for r in t.make_problems(0, 5)] == ["5", "8"]
    assert t.reward_names == ("correct",)


def test_a_prompt_ending_with_a_tool_message_is_the_episodes_next_turn(files, tmp_path):
    """An SFT row per assistant turn of a tool conversation: the prompt [user, assistant's call,
    tool's result] reads what a multi-turn episode has in its cache before its second turn (the
    first prompt, the assistant's message and end of turn, then `observation_ids`)."""
    from vpo.env.episode import observation_ids

    user = {"role": "user", "content": "Reach 5 from 2, 3."}
    call = {"role": "assistant", "content": "calc: 2 + 3"}
    result = {"role": "tool", "content": "= 5"}
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": [user], "completion": "calc: 2 + 3"},
        {"prompt": [user, call, result], "completion": "answer: 2 + 3"})))
    t = bind(make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"]),
             load_tokenizer(BPE))
    tok = t.tokenizer
    first, second = t.make_problems(0, 2)
    stop = "<|im_end|>"
    episode = (tok.decode(t.prompt_ids(first, 1), skip_special_tokens=False) + call["content"]
               + stop + tok.decode(observation_ids(tok, [user, call], [result], stop),
                                   skip_special_tokens=False))
    assert tok.decode(t.prompt_ids(second, 1), skip_special_tokens=False) == episode


@pytest.mark.parametrize("row, message", [
    ({"question": "hi"}, r"bad.jsonl:2: prompt: missing \(columns: answer, completion, "
                         r"question\)"),
    ({"prompt": "  "}, r"bad.jsonl:2: prompt: is empty"),
    ({"prompt": [{"role": "user"}]}, r"bad.jsonl:2: prompt: must be text or a non-empty list"),
    ({"prompt": [{"role": "assistant", "content": "x"}]}, r"bad.jsonl:2: prompt: the last chat "
                                                          r"message has role 'assistant'"),
    ({"prompt": 3}, r"bad.jsonl:2: prompt: must be text"),
    ({"prompt": "x" * 500}, None),  # fine: a long prompt is only cut in messages
    ({"prompt": "hi", "completion": 7}, r"bad.jsonl:2: completion: must be text"),
    ({"prompt": ["x" * 500]}, r"prompt: must be text .* got list \['x{50}"),
])
def test_bad_rows_are_named(files, tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    row = {"answer": "8", "completion": "8", **row}  # the first row's columns
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(row) + "\n")
    if message is None:
        make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"])
        return
    with pytest.raises(ValueError, match=message) as e:
        make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"])
    assert len(str(e.value)) < 300  # values cut in messages


@pytest.mark.parametrize("row, message", [
    ({"prompt": "hi", "completion": "8"}, r"bad.jsonl:2: no answer column; give every row the "
                                          r"same columns"),
    ({"prompt": "hi", "answer": "8", "completion": "8", "hint": "x"},
     r"bad.jsonl:2: a column the first row lacks: hint; give every row the same columns"),
    ({"prompt": "hi", "answer": None, "completion": "8"}, None),  # null: a column, no value
])
def test_every_row_has_the_first_rows_columns(files, tmp_path, row, message):
    """A reward function gets every column for every row: a row without one is refused, not
    scored with None (or, a column only later rows have, not silently dropped)."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(row) + "\n")
    if message is None:
        make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"])
        return
    with pytest.raises(ValueError, match=message):
        make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"])


def test_bad_file_bytes_are_named(files, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not UTF-8 text \(byte 0xe9 at column "):
        make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"])
    path.write_text('{"prompt": "' + "x" * (1 << 20) + '"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: the row is 1,048,\d+ bytes, over"):
        make_task("dataset", path=str(path), rewards=[f"{files}/rewards.py:short"])


def test_bad_weights_and_missing_file(files):
    from vpo.errors import ConfigError

    kw = dict(path=str(files / "rows.jsonl"), rewards=[f"{files}/rewards.py:short"])
    with pytest.raises(ConfigError, match="--weights: 2 weights for 1 reward components"):
        make_task("dataset", weights=[1, 2], **kw)
    with pytest.raises(ConfigError, match="non-negative"):
        make_task("dataset", weights=[-1], **kw)
    with pytest.raises(ConfigError, match="--data: no file"):
        make_task("dataset", path=str(files / "nope.jsonl"), rewards=kw["rewards"])


def test_solved_by_names_the_components_that_define_solved(files):
    """By default solved is w*ᵀr = 1, so a continuous component that never reaches 1 (short:
    1 - len/10) makes every answer unsolved; --solved correct makes correctness alone decide."""
    from vpo.config import ConfigError

    kw = dict(path=str(files / "rows.jsonl"),
              rewards=[f"{files}/rewards.py:correct", f"{files}/rewards.py:short"])
    right_but_long = np.array([1.0, 0.6], np.float32)
    assert not bool(make_task("dataset", **kw).solved(right_but_long))
    by_correct = make_task("dataset", **kw, solved_by=["correct"])
    assert bool(by_correct.solved(right_but_long))
    assert not bool(by_correct.solved(np.array([0.0, 1.0], np.float32)))
    with pytest.raises(ConfigError, match="no component named brevity; the components are "
                                          "correct, short"):
        make_task("dataset", **kw, solved_by=["brevity"])
