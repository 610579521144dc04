"""A TRL user's reward functions work unchanged: written as TRL's documentation writes them
(GRPOTrainer's custom-reward examples and `trl.rewards`), standard and conversational, driven
through the dataset task's host scorer; None means "does not apply"; and reward code cannot end
a run quietly or change the dataset (sys.exit, a dead or stuck worker, edited inputs)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from vpo.errors import ConfigError, RewardError
from vpo.io.tokenizer import load_tokenizer
from vpo.tasks import make_task
from vpo.tasks.bound import bind
from vpo.tasks.reward_fns import RewardScorer, load_reward_fns

BPE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")

# As TRL's documentation writes them (GRPOTrainer "Using a custom reward function", examples
# 1-6, and trl.rewards), except where vpo's contract differs: rewards in [0, 1] (the multi-task
# example's -1.0 for a wrong answer is 0.0 here) and a stand-in for math_verify's parser.
TRL_REWARDS = r'''
import asyncio
import re


def reward_func(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token
    count)."""
    return [float(len(ids)) for ids in completion_ids]


def reward_len(completions, **kwargs):  # TRL's quickstart: completions near 20 characters
    return [-abs(20 - len(completion)) for completion in completions]


def char_length_reward(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character
    count)."""
    return [float(len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def boxed_reward(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def think_format_reward(completions, **kwargs):
    pattern = r"^<think>(?!.*<think>)(.*?)</think>.*$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content, re.DOTALL | re.MULTILINE)
               for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def parse(text):  # stands in for math_verify.parse: the \boxed{} or bare number, else []
    m = re.search(r"\\boxed\{(.*?)\}", text) or re.fullmatch(r"\s*(-?\d+)\s*", text)
    return [m.group(1)] if m else []


def accuracy_reward(completions, solution, log_extra=None, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    rewards = []
    for content, sol in zip(contents, solution, strict=True):
        gold_parsed = parse(sol)
        if len(gold_parsed) != 0:
            answer_parsed = parse(content)
            reward = float(gold_parsed == answer_parsed)
        else:
            # If the gold solution cannot be parsed, we assign `None` to skip this example
            reward = None
        rewards.append(reward)
    if log_extra is not None:
        log_extra("solution", list(solution))
    return rewards


def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            correct = completion.strip() == str(eval(prompt.split("is ")[1].rstrip("?")))
            reward = 1.0 if correct else 0.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards


def coding_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "code":
            works = completion.startswith("def ")
            reward = 1.0 if works else 0.0
            rewards.append(reward)
        else:
            # Return None for non-coding tasks
            rewards.append(None)
    return rewards


async def async_reward_func(prompts, completions, **kwargs):
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]


def logging_reward(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
    extracted = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
    extracted = [m.group(1) if m else None for m in extracted]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]
    if log_extra:
        log_extra("golden_answer", list(ground_truth))
    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))
    return rewards


def curriculum(completions, trainer_state=None, **kwargs):
    step = trainer_state.global_step if trainer_state is not None else 0
    return [min(1.0, 0.5 + 0.01 * step) for _ in completions]


def positional(p, c, **kw):  # not TRL-shaped: its arguments are not the keywords TRL passes
    return [0.0 for _ in c]


def no_kwargs(completions):  # TRL passes prompts, completion_ids, ... too
    return [0.0 for _ in completions]
'''

FAULTS = r'''
import os
import sys
import time

def exits(prompts, completions, **kwargs):
    sys.exit(0)
exits.reward_names = ("exits",)

def exits_on_probe(prompts, completions, **kwargs):
    sys.exit(0)

def dies(prompts, completions, **kwargs):
    os._exit(3)
dies.reward_names = ("dies",)

def spins(prompts, completions, **kwargs):
    while True:
        pass
spins.reward_names = ("spins",)

def spins_on_probe(prompts, completions, **kwargs):
    while True:
        pass

def interrupted(prompts, completions, **kwargs):
    raise KeyboardInterrupt
interrupted.reward_names = ("interrupted",)

def quick(prompts, completions, **kwargs):
    return [0.5 for _ in completions]

def edits(prompts, completions, answer, tags, **kwargs):
    """Rewrites every input it gets, as a careless verifier might."""
    for p in prompts:
        if isinstance(p, list):
            p[0]["content"] = "EDITED"
            p.append({"role": "user", "content": "EDITED"})
    prompts[0] = "EDITED"
    for t in tags:
        t.append("EDITED")
    answer[0] = "EDITED"
    completions[0] = "EDITED"
    return [1.0 for _ in completions]

def sees(prompts, completions, answer, tags, **kwargs):
    """1.0 when its inputs are the dataset's own."""
    SEEN.append((prompts, completions, answer, tags))
    return [1.0 for _ in completions]
SEEN = []
'''

STANDARD = [
    {"prompt": "Problem: Solve the equation $2x + 3 = 7$. Solution:", "ground_truth": "2"},
    {"prompt": "Problem: Solve the equation $3x - 5 = 10$.", "ground_truth": "5"},
]
CHAT = [
    {"prompt": [{"role": "user", "content": "What is the result of (1 + 2) * 4?"}],
     "solution": r"\boxed{12}"},
    {"prompt": [{"role": "system", "content": "Think first."},
                {"role": "user", "content": "What is the result of (3 + 1) * 2?"}],
     "solution": "eight"},  # not parseable: accuracy_reward returns None
]
MULTITASK = [
    {"prompt": "What is 2+2?", "task": "math"},
    {"prompt": "Write a function that returns the sum of two numbers.", "task": "code"},
    {"prompt": "Translate 'chat' into English.", "task": "translation"},  # no function applies
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("trl")
    (d / "trl_rewards.py").write_text(TRL_REWARDS)
    (d / "faults.py").write_text(FAULTS)
    for name, rows in (("standard", STANDARD), ("chat", CHAT), ("multitask", MULTITASK)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def task_of(files, data, *names, module="trl_rewards.py", **kw):
    return make_task("dataset", path=str(files / f"{data}.jsonl"),
                     rewards=[f"{files}/{module}:{n}" for n in names], **kw)


def score(task, *answers):
    """The host scorer on one answer per row (m = 1): (rewards_NR, valid_N)."""
    records = task.make_problems(0, len(answers))
    rewards, valid = task.score(records, [[a] for a in answers])
    return rewards[:, 0], valid[:, 0]


def test_standard_examples_score_text_completions(files):
    task = task_of(files, "standard", "boxed_reward", "logging_reward", "async_reward_func",
                   "curriculum")
    assert task.reward_names == ("boxed_reward", "logging_reward", "async_reward_func",
                                 "curriculum")
    rewards, valid = score(task, r"The solution is \boxed{2}.", r"The solution is \boxed{6}.")
    np.testing.assert_allclose(rewards, [[1, 1, 1, 0.5], [0, 0, 1, 0.5]])
    assert valid.all()


def test_conversational_examples_get_message_lists(files):
    task = task_of(files, "chat", "format_reward_func", "think_format_reward",
                   "accuracy_reward")
    good = r"<think>(1 + 2) * 4 = 12</think><answer>\boxed{12}</answer>"
    rewards, valid = score(task, good, "It is 8.")
    np.testing.assert_allclose(rewards, [[1, 1, 1], [0, 0, 0]])  # row 1: accuracy is None
    assert valid.all()


def test_bound_chat_task_scores_generated_text(files):
    task = bind(task_of(files, "chat", "think_format_reward"), load_tokenizer(BPE))
    tok = task.tokenizer
    records = task.make_problems(0, 2)
    ids = [tok.encode("<think>x</think> 12") + [tok.eos_id], tok.encode("12") + [tok.eos_id]]
    T = max(map(len, ids))
    tokens = np.array([x + [tok.pad_id] * (T - len(x)) for x in ids], np.int32)
    mask = np.array([[True] * len(x) + [False] * (T - len(x)) for x in ids])
    rewards, valid = task.host_score(records, tokens, mask, 1)
    np.testing.assert_allclose(rewards[:, 0, 0], [1.0, 0.0])


def test_none_means_the_component_does_not_apply(files):
    """TRL's multi-task example: math_reward_func is None on code rows and the reverse. None
    is reported as not applying and scores 0 (TRL's nansum); an answer that no function
    applies to (the translation row) is unscorable: an invalid slot."""
    task = task_of(files, "multitask", "math_reward_func", "coding_reward_func")
    with pytest.warns(UserWarning, match="returned None for a completion of dataset row 2"):
        rewards, valid = score(task, "4", "def add(a, b): return a + b", "cat")
    np.testing.assert_allclose(rewards, [[1, 0], [0, 1], [0, 0]])
    assert valid.tolist() == [True, True, False]
    fns = load_reward_fns([f"{files}/trl_rewards.py:math_reward_func",
                           f"{files}/trl_rewards.py:coding_reward_func"], MULTITASK[0])
    _, applies = RewardScorer(fns).score(MULTITASK[:2], ["5", "x"], [0, 1])
    assert applies.tolist() == [[True, False], [False, True]]


def test_none_is_left_out_of_the_components_metrics(files):
    """reward/<name> averages a component over the answers it applies to (TRL's nanmean):
    math_reward_func over the math row only, coding_reward_func over the code row only; an
    unscorable answer (no function applies) counts 0 in every component, like an empty one."""
    from vpo.rollout.rewards import component_means

    task = bind(task_of(files, "multitask", "math_reward_func", "coding_reward_func"),
                load_tokenizer(BPE))
    tok = task.tokenizer
    records = task.make_problems(0, 3)
    ids = [tok.encode(t) + [tok.eos_id] for t in ("4", "def add(a, b): return a + b", "cat")]
    T = max(map(len, ids))
    tokens = np.array([x + [tok.pad_id] * (T - len(x)) for x in ids], np.int32)
    mask = np.array([[True] * len(x) + [False] * (T - len(x)) for x in ids])
    with pytest.warns(UserWarning, match="returned None"):
        rewards, valid, applies = task.host_score_applies(records, tokens, mask, 1)
    assert applies[:, 0].tolist() == [[True, False], [False, True], [True, True]]
    means = component_means(task.reward_names, rewards, applies)
    assert means == {"reward/math_reward_func": 0.5, "reward/coding_reward_func": 0.5}
    assert np.isnan(component_means(("a",), np.zeros((2, 1)), np.zeros((2, 1), bool))["reward/a"])


def test_completion_ids_reach_functions_when_given(files):
    from vpo.tasks.reward_fns import RewardFn, load_callable

    spec = f"{files}/trl_rewards.py:reward_func"
    s = RewardScorer([RewardFn(spec, load_callable(spec), ("reward_func",))])
    with pytest.raises(RewardError, match=r"reward_func: value 2.0 for dataset row 0 .*"
                                          r"outside \[0, 1\]"):  # TRL's example is unbounded
        s.score(STANDARD, [" blue.", " in the sky."], [0, 1], [[6303, 13], [304, 279, 12884, 13]])
    # the dataset task has text only: a function that reads the ids is told so, at load time
    with pytest.raises(RewardError, match="reward_func raised LookupError: completion_ids: token "
                                          "ids are not available .* count tokens from"):
        task_of(files, "standard", "reward_func")


def test_unbounded_trl_rewards_are_named_with_how_to_fix(files):
    task = task_of(files, "standard", "char_length_reward")
    with pytest.raises(RewardError, match=r"char_length_reward: value 5.0 for dataset row 0 "
                                          r".*outside \[0, 1\].* --reward-range "
                                          r"char_length_reward=LO:HI"):
        score(task, " blue.", " in the sky.")  # answers are stripped: "blue." is 5


def test_trl_rewards_on_their_own_scale_run_with_a_declared_range(files):
    """TRL's quickstart reward (-abs(20 - len)) and a raw length run unchanged once their
    range is declared: v → (v - lo) / (hi - lo), clipped to [0, 1] with one warning."""
    from vpo.cli import arguments

    ranges = arguments.parse_reward_ranges(["reward_len=-20:0", "char_length_reward=0:20"])
    assert ranges == {"reward_len": [-20.0, 0.0], "char_length_reward": [0.0, 20.0]}
    task = task_of(files, "standard", "reward_len", "char_length_reward",
                   reward_ranges=ranges)
    rewards, valid = score(task, "x" * 20, "x" * 10)  # lengths 20, 10
    np.testing.assert_allclose(rewards, [[1.0, 1.0], [0.5, 0.5]])
    assert valid.all()
    with pytest.warns(UserWarning, match=r"reward reward_len: values outside its declared "
                                         r"range \[-20, 0\] were clipped"):
        rewards, _ = score(task, "x" * 45, "x" * 5)  # -25 → 0 (clipped); length 45 → 1
    np.testing.assert_allclose(rewards, [[0.0, 1.0], [0.25, 0.25]])
    with pytest.raises(ConfigError, match="no reward component is called 'reward_length'; the "
                                          "components are reward_len"):
        task_of(files, "standard", "reward_len", reward_ranges={"reward_length": (-1, 0)})
    with pytest.raises(ConfigError, match="give LO < HI"):
        task_of(files, "standard", "reward_len", reward_ranges={"reward_len": (0, -50)})
    with pytest.raises(ConfigError, match="expected NAME=LO:HI"):
        arguments.parse_reward_ranges(["reward_len=-50"])


@pytest.mark.parametrize("name, signature, missing", [
    ("positional", r"positional\(p, c, \*\*kw\)", "missing a required argument: 'p'"),
    ("no_kwargs", r"no_kwargs\(completions\)", "got an unexpected keyword argument 'prompts'"),
])
def test_a_signature_that_does_not_fit_says_what_was_passed(files, name, signature, missing):
    with pytest.raises(RewardError) as e:
        task_of(files, "standard", name)
    msg = str(e.value)
    assert f"trl_rewards.py:{name}" in msg and missing in msg
    assert re.search(signature, msg)
    assert "by keyword" in msg and "prompts, completions, completion_ids, ground_truth" in msg


def test_a_column_may_not_take_a_keywords_name(files, tmp_path):
    path = tmp_path / "clash.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "completions": "x"}) + "\n")
    with pytest.raises(ValueError, match="column 'completions' has the name of a keyword"):
        make_task("dataset", path=str(path), rewards=[f"{files}/trl_rewards.py:curriculum"])


# -- faults -----------------------------------------------------------------------------------

def test_sys_exit_in_a_reward_function_is_a_reward_error(files):
    with pytest.raises(RewardError, match=r"faults.py:exits_on_probe called sys.exit\(0\) on a "
                                          r"batch of 1 completions from dataset rows \[0\]"):
        task_of(files, "standard", "exits_on_probe", module="faults.py")
    task = task_of(files, "standard", "exits", module="faults.py")
    with pytest.raises(RewardError, match=r"faults.py:exits called sys.exit\(0\) .*rows \[0, 1\]"):
        score(task, "a", "b")


def test_a_keyboard_interrupt_stops_the_run_as_the_users(files):
    task = task_of(files, "standard", "interrupted", module="faults.py")
    with pytest.raises(KeyboardInterrupt):
        score(task, "a", "b")


def test_vpo_train_refuses_a_reward_function_that_exits(files, tmp_path, capsys):
    from vpo.cli import main as cli

    rc = cli.main(["train", "--data", str(files / "standard.jsonl"), "--reward",
                   f"{files}/faults.py:exits_on_probe", f"model=hf:{BPE}",
                   "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc != 0 and "exits_on_probe called sys.exit(0)" in err and "Traceback" not in err


def test_sys_exit_and_a_dead_worker_are_reward_errors(files):
    for name, message in (("exits", r"exits called sys.exit\(0\)"),
                          ("dies", r"dies: its worker process died \(on a batch of 2 completions "
                                   r"from dataset rows \[0, 1\]\)")):
        task = task_of(files, "standard", name, module="faults.py", reward_workers=1,
                       reward_timeout=60)
        with pytest.raises(RewardError, match=message):
            score(task, "a", "b")
        with pytest.raises(RewardError, match="stopped after an earlier failure"):
            score(task, "a", "b")


def test_a_timed_out_worker_is_killed_so_the_process_exits(files, tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(f"""
        from vpo.errors import RewardError
        from vpo.tasks import make_task

        def load(*names):
            return make_task("dataset", path={str(files / "standard.jsonl")!r},
                             rewards=[{f"{files}/faults.py:"!r} + n for n in names],
                             reward_workers=2, reward_timeout=1.0)

        if __name__ == "__main__":
            try:  # stuck on the load-time call
                load("spins_on_probe")
            except RewardError as e:
                print("ERROR", e, flush=True)
            task = load("spins", "quick")
            try:  # stuck on a step's call
                task.score(task.make_problems(0, 2), [["a"], ["b"]])
            except RewardError as e:
                print("ERROR", e, flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the stuck worker too
        proc.communicate()
        pytest.fail("the process did not exit after the reward timeout")
    assert proc.returncode == 0, err
    assert "spins_on_probe: no result within 1.0 s (on a batch of 1 completions" in out
    assert "spins: no result within 1.0 s (on a batch of 2 completions" in out


def test_reward_functions_get_copies(files, tmp_path):
    """A function that edits its inputs (at the load-time probe and at every call) changes
    neither the dataset nor what the next function sees."""
    rows = [{"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5",
             "tags": ["sum"]},
            {"prompt": "What is 4 + 4?", "answer": "8", "tags": ["sum"]}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task("dataset", path=str(path),
                     rewards=[f"{files}/faults.py:edits", f"{files}/faults.py:sees"])
    records = task.make_problems(0, 2)
    assert [{k: v for k, v in r.items() if k != "_row"} for r in records] == rows
    mod = next(m for n, m in sys.modules.items()
               if n.startswith("vpo_rewards_") and n.endswith("faults_py"))
    mod.SEEN.clear()
    rewards, valid = task.score(records, [["5"], ["8"]])
    assert [{k: v for k, v in r.items() if k != "_row"} for r in records] == rows
    prompts, completions, answer, tags = mod.SEEN[0]
    assert prompts == [r["prompt"] for r in rows] and answer == ["5", "8"]
    assert completions == [[{"role": "assistant", "content": "5"}], "8"]
    assert tags == [["sum"], ["sum"]]
    assert valid.all()


# -- end to end -------------------------------------------------------------------------------

@pytest.mark.slow
def test_vpo_train_stops_on_sys_exit_in_a_reward_worker(files, tmp_path, capsys):
    from vpo.cli import main as cli

    out = str(tmp_path / "run")
    rc = cli.main(["train", "--data", str(files / "standard.jsonl"), "--reward",
                   f"{files}/faults.py:exits", "--reward-workers", "1", f"model=hf:{BPE}",
                   "train.batch_size=8", "sampler.num_samples=2", "sampler.max_new_tokens=12",
                   "train.steps=1", "--out", out])
    err = capsys.readouterr().err
    assert rc != 0 and "faults.py:exits called sys.exit(0)" in err and "Traceback" not in err
    assert not os.path.exists(os.path.join(out, "policy"))


@pytest.mark.slow
def test_vpo_train_with_trl_reward_functions(files, tmp_path):
    """`vpo train --data --reward` on TRL-shaped functions, a chat dataset with a None
    component, on the BPE fixture: the run finishes with a policy and named metrics."""
    from vpo.cli import main as cli

    out = str(tmp_path / "run")
    argv = ["train", "--data", str(files / "chat.jsonl"),
            "--reward", f"{files}/trl_rewards.py:think_format_reward",
            "--reward", f"{files}/trl_rewards.py:accuracy_reward",
            "--reward", f"{files}/trl_rewards.py:async_reward_func",
            f"model=hf:{BPE}", "train.batch_size=8", "sampler.num_samples=2",
            "sampler.max_new_tokens=12", "train.steps=1", "--out", out]
    assert cli.main(argv) == 0
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert {"reward/think_format_reward", "reward/accuracy_reward",
            "reward/async_reward_func"} <= set(rows[-1])
    assert os.path.isdir(os.path.join(out, "policy"))
