"""Users' reward functions: loading by spec, one component each (dict returns: several), every
kind of bad output a RewardError naming the function, the dataset row and the value, and the
process pool with its per-call timeout."""

import math

import numpy as np
import pytest

from vpo.errors import ConfigError, RewardError
from vpo.tasks.reward_fns import RewardScorer, load_callable, load_reward_fns

REWARDS = '''
import math, time

def correct(prompts, completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, **kw):
    return [max(0.0, 1.0 - len(c) / 10) for c in completions]

def parts(prompts, completions, **kw):
    return {"has_digit": [float(any(ch.isdigit() for ch in c)) for c in completions],
            "lower": [float(c == c.lower()) for c in completions]}

def exact(prompts, completions, answer, **kw):
    return [c == a for c, a in zip(completions, answer)]  # bools: pass / fail

def raises(prompts, completions, **kw):
    raise RuntimeError("verifier crashed")

def wrong_length(prompts, completions, **kw):
    return [0.5] * (len(completions) + 1)

def nan_at_1(prompts, completions, **kw):
    return [math.nan if i == 1 else 0.5 for i in range(len(completions))]

def inf_at_1(prompts, completions, **kw):
    return [math.inf if i == 1 else 0.5 for i in range(len(completions))]

def strings(prompts, completions, **kw):
    return ["0.5" for _ in completions]

def one_string(prompts, completions, **kw):
    return "0.5"

def negative(prompts, completions, **kw):
    return [-1.0 for _ in completions]

def changes_keys(prompts, completions, **kw):
    changes_keys.calls = getattr(changes_keys, "calls", 0) + 1
    return {("a" if changes_keys.calls == 1 else "b"): [0.0] * len(completions)}

def slow(prompts, completions, **kw):
    time.sleep(30)
    return [0.0] * len(completions)
slow.reward_names = ("slow",)
'''

ROWS = [{"prompt": "2+3?", "answer": "5", "_row": 7}, {"prompt": "1+1?", "answer": "2", "_row": 9}]


@pytest.fixture(scope="module")
def rewards_py(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "my_rewards.py"
    path.write_text(REWARDS)
    return str(path)


def scorer(rewards_py, *names, **kw):
    return RewardScorer(load_reward_fns([f"{rewards_py}:{n}" for n in names], ROWS[0]), **kw)


def test_components_are_functions_and_dict_keys(rewards_py):
    s = scorer(rewards_py, "correct", "short", "parts")
    assert s.names == ("correct", "short", "has_digit", "lower")
    got = s([ROWS[0], ROWS[1], ROWS[1]], ["it is 5", "two", "2"], [7, 9, 9])
    np.testing.assert_allclose(got, [[1, 0.3, 1, 1], [0, 0.7, 0, 1], [1, 0.9, 1, 1]], atol=1e-6)
    assert got.dtype == np.float32
    assert s([], [], []).shape == (0, 4)


def test_pass_fail_bools_score_one_and_zero(rewards_py):
    s = scorer(rewards_py, "exact")
    got = s([ROWS[0], ROWS[1], ROWS[1]], ["5", "2", "two"], [7, 9, 9])
    np.testing.assert_array_equal(got, [[1.0], [1.0], [0.0]])


def test_dotted_module_specs_load(monkeypatch, rewards_py):
    import os
    import sys

    monkeypatch.syspath_prepend(os.path.dirname(rewards_py))
    sys.modules.pop("my_rewards", None)
    assert load_callable("my_rewards:short")([""], ["abcde"]) == [0.5]


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "expected MODULE:FUNCTION"),
    ("/nonexistent/rewards.py:f", "no file /nonexistent/rewards.py"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("math:no_such_function", "math has no function 'no_such_function'"),
])
def test_bad_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_callable(spec)


def test_duplicate_component_names_are_refused(rewards_py):
    with pytest.raises(ConfigError, match=r"\['short'\] appear twice"):
        load_reward_fns([f"{rewards_py}:short", f"{rewards_py}:short"], ROWS[0])


@pytest.mark.parametrize("name, message", [
    ("raises", r"raises raised RuntimeError: verifier crashed .*rows \[7, 9\]"),
    ("wrong_length", r"wrong_length: returned 3 values for 2 completions"),
    ("nan_at_1", r"nan_at_1: value nan for dataset row 9 \(call item 1\) is not finite"),
    ("inf_at_1", r"inf_at_1: value inf for dataset row 9 \(call item 1\) is not finite"),
    ("strings", r"strings: value '0.5' for dataset row 7 \(call item 0\) is not a number"),
    ("one_string", r"one_string: returned str '0.5'; return a list of 2 floats"),
    ("negative", r"negative: value -1.0 for dataset row 7 .* is outside \[0, 1\]"),
    ("changes_keys", r"changes_keys: returned components \['b'\], expected \['a'\]"),
])
def test_each_bad_output_names_function_row_and_value(rewards_py, name, message):
    s = scorer(rewards_py, "short", name) if name != "raises" else None
    if s is None:  # a raising function cannot even be probed: declare its name
        import importlib.util

        spec = importlib.util.spec_from_file_location("raising_rewards", rewards_py)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        from vpo.tasks.reward_fns import RewardFn
        s = RewardScorer([RewardFn(f"{rewards_py}:raises", mod.raises, ("raises",))])
    with pytest.raises(RewardError, match=message):
        s(ROWS, ["a", "b"], [7, 9])


def test_probe_of_a_raising_function_names_it(rewards_py):
    with pytest.raises(RewardError, match="raises raised RuntimeError"):
        load_reward_fns([f"{rewards_py}:raises"], ROWS[0])


def test_process_pool_runs_functions_and_times_out(rewards_py):
    s = scorer(rewards_py, "correct", "slow", workers=2, timeout=1.0)
    try:
        with pytest.raises(RewardError, match=r"slow: no result within 1.0 s"):
            s(ROWS, ["5", "x"], [7, 9])
    finally:
        s.close()
    s = scorer(rewards_py, "correct", "parts", workers=1, timeout=60)
    try:
        got = s(ROWS, ["5", "X"], [7, 9])
    finally:
        s.close()
    np.testing.assert_allclose(got, [[1, 1, 1], [0, 0, 0]])
    assert not math.isnan(got.sum())
