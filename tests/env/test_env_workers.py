"""Environments in worker processes (`vpo.env.workers`, `--env-workers`): each environment keeps
its state in the worker it was placed on, a turn's calls run in parallel, a hung call is killed
at the timeout, a dying worker and a raising environment are named, and episodes run through
workers equal episodes run in this process."""

import os
import time

import jax
import numpy as np
import pytest

from vpo.env import episode as episode_lib
from vpo.env.workers import EnvWorkers, call_envs
from vpo.errors import ConfigError, EnvError

ENV = '''
import os, time

class Probe:
    reward_names = ("turns",)
    weights = (1.0,)

    def reset(self, row):
        self.n = 0
        return [{"role": "user", "content": f"row {row['i']}"}]

    def step(self, messages):
        said = messages[-1]["content"]
        if "hang" in said:
            time.sleep(600)
        if "die" in said:
            os._exit(3)
        if "raise" in said:
            raise RuntimeError("boom")
        start = time.time()
        if "wait" in said:
            time.sleep(0.5)
        if "big" in said:
            return [{"role": "tool", "content": "x" * 4096}]
        self.n += 1
        return [{"role": "tool", "content": f"{os.getpid()} {self.n} {start} {time.time()}"}]

    def score(self, messages):
        return [min(1.0, self.n / 3)]

def make_env():
    return Probe()
'''


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "probe_env.py").write_text(ENV)
    return f"{tmp_path / 'probe_env.py'}:make_env"


def _say(text):
    return ([{"role": "user", "content": "x"}, {"role": "assistant", "content": text}],)


def test_state_stays_with_each_environment_and_a_turns_calls_overlap(spec):
    pool = EnvWorkers(spec, 3, timeout=30.0)
    try:
        assert pool.reward_names == ("turns",) and pool.weights == (1.0,)
        envs = [pool.factory() for _ in range(3)]
        for i, env in enumerate(envs):
            assert env.reset({"i": i}) == [{"role": "user", "content": f"row {i}"}]
        envs[0].step(*_say("go"))  # only the first environment has taken a step
        out = call_envs(spec, "step", envs, [_say("wait")] * 3, rows=[0, 1, 2])
        pids, counts, starts, ends = zip(*[
            (int(p), int(n), float(a), float(b))
            for p, n, a, b in (o[0]["content"].split() for o in out)], strict=True)
        assert len(set(pids)) == 3 and os.getpid() not in pids  # one worker each
        assert counts == (2, 1, 1)  # each instance kept its own count
        assert max(starts) < min(ends)  # the three calls were running at the same time
        assert call_envs(spec, "score", envs, [_say("")] * 3, rows=[0, 1, 2]) == [
            [2 / 3], [1 / 3], [1 / 3]]
    finally:
        pool.close()


@pytest.mark.parametrize("said, words", [
    ("hang", r"step on dataset row 7 took longer than 1 s \(--env-timeout\); its worker was "
             r"stopped"),
    ("die", r"step on dataset row 7: its worker process died"),
    ("raise", r"step on dataset row 7 raised RuntimeError: boom \(at .*probe_env.py:\d+\)"),
])
def test_a_hung_dying_or_raising_call_is_named_and_stops_the_workers(spec, said, words):
    pool = EnvWorkers(spec, 2, timeout=1.0)
    try:
        envs = [pool.factory() for _ in range(2)]
        for env in envs:
            env.reset({"i": 0})
        t0 = time.time()
        with pytest.raises(EnvError, match=words):
            call_envs(spec, "step", envs, [_say("go"), _say(said)], rows=[6, 7])
        assert time.time() - t0 < 30  # the hang was not waited out
        assert not any(p.is_alive() for p in pool._procs)  # the hung call is killed
        with pytest.raises(EnvError, match="the environment workers were stopped: step on "
                                           "dataset row 7"):
            envs[0].step(*_say("go"))
    finally:
        pool.close()


def test_many_large_messages_do_not_fill_the_pipes(spec):
    """200 calls of 4 KB conversations answered by 4 KB observations on one worker: more than
    a pipe holds, one call in flight at a time, so nothing blocks."""
    pool = EnvWorkers(spec, 1, timeout=30.0)
    try:
        envs = [pool.factory() for _ in range(200)]
        call_envs(spec, "reset", envs, [({"i": 0},)] * 200, rows=[0] * 200)
        messages = ([{"role": "user", "content": "y" * 4096},
                     {"role": "assistant", "content": "big"}],)
        out = call_envs(spec, "step", envs, [messages] * 200, rows=list(range(200)))
        assert [len(o[0]["content"]) for o in out] == [4096] * 200
    finally:
        pool.close()


def test_a_closed_pool_refuses_calls_by_name(spec):
    pool = EnvWorkers(spec, 1, timeout=None)
    env = pool.factory()
    pool.close()
    pool.close()  # twice is fine
    with pytest.raises(EnvError, match="the environment workers were stopped: they were closed"):
        env.reset({"i": 0})
    with pytest.raises(EnvError, match="were stopped"):
        pool.factory()


def test_a_factory_that_fails_in_the_worker_is_named(tmp_path):
    (tmp_path / "bad_env.py").write_text("def make_env():\n    raise ValueError('no index')\n")
    with pytest.raises(EnvError, match=r"make_env raised .*no index"):
        EnvWorkers(f"{tmp_path / 'bad_env.py'}:make_env", 1, timeout=None)
    # built without a round trip: a later environment that fails is named at its first call
    (tmp_path / "third_env.py").write_text(ENV + (
        "\nBUILT = []\n\ndef third():\n    BUILT.append(1)\n    if len(BUILT) == 4:\n"
        "        raise ValueError('the fourth')\n    return Probe()\n"))
    pool = EnvWorkers(f"{tmp_path / 'third_env.py'}:third", 1, timeout=None)
    try:
        first, second = pool.factory(), pool.factory()  # the load check and the probe: 2
        assert first.reset({"i": 0})
        with pytest.raises(EnvError, match=r"make_env on dataset row 5 raised ValueError: the "
                                           r"fourth \(at .*third_env.py:\d+\)"):
            call_envs("third", "reset", [second], [({"i": 0},)], rows=[5])
    finally:
        pool.close()


def test_episodes_through_workers_equal_episodes_in_process():
    """The calculator environment, the tiny fixture policy, the same keys: the same messages,
    rewards and tokens with the environments in 2 workers as in this process."""
    import pathlib

    from vpo.env.calculator import CalculatorEnv
    from vpo.io import hf

    fixture = pathlib.Path(__file__).parent.parent / "fixtures" / "hf" / "qwen2_tied"
    model, tok = hf.from_pretrained(fixture, dtype="float32"), hf.load_tokenizer(fixture)
    rows = CalculatorEnv().problems(0, 2)
    keys = jax.random.split(jax.random.key(0), 6).reshape(2, 3)
    pool = EnvWorkers("vpo.env.calculator:make_env", 2, timeout=60.0)

    def run(make):
        return episode_lib.run_episodes(
            model, tok, [[make() for _ in range(3)] for _ in rows], rows, keys, max_tokens=48,
            max_turns=3, reward_names=CalculatorEnv.reward_names)

    try:
        here, there = run(CalculatorEnv), run(pool.factory)
    finally:
        pool.close()
    assert here.messages == there.messages
    np.testing.assert_array_equal(here.rewards_BGR, there.rewards_BGR)
    np.testing.assert_array_equal(np.asarray(here.rollout.tokens_BGT),
                                  np.asarray(there.rollout.tokens_BGT))


def test_env_workers_flag_needs_env_and_a_count(capsys):
    from vpo.cli.main import main
    from vpo.env.task import make_env_task

    with pytest.raises(ConfigError, match="task_kwargs.workers: must be an integer >= 0"):
        make_env_task("vpo.env.calculator:make_env", workers=-1)
    assert main(["train", "--env-workers", "2", "--out", "/tmp/never"]) != 0
    assert "--env-workers needs --env MODULE:FACTORY" in capsys.readouterr().err


def test_an_in_process_call_past_its_timeout_does_not_keep_the_process_alive():
    """Without workers a hung call cannot be stopped, but the run that ends with its error
    exits: the call's thread is a daemon. (An environment's own TimeoutError is its error.)"""
    import subprocess
    import sys

    code = ("import time\nfrom vpo.env.base import call_env\nfrom vpo.errors import EnvError\n"
            "try:\n    call_env('e', 'step', time.sleep, 120, timeout=0.2, row=3)\n"
            "except EnvError as e:\n    print(e)\n")
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100)
    assert "e: step on dataset row 3 took longer than 0.2 s" in out.stdout, out.stderr
    assert time.time() - t0 < 60  # not the 120 s of the hung call

    def own():
        raise TimeoutError("the index did not answer")

    from vpo.env.base import call_env

    with pytest.raises(EnvError, match="raised TimeoutError: the index did not answer"):
        call_env("e", "step", own, timeout=5.0)


def test_an_environment_file_imports_the_modules_beside_it(tmp_path):
    """`--env folder/my_env.py:make_env` whose file imports `helpers` from its own folder, in
    this process and in a worker, as Python runs a script."""
    from vpo.env.base import load_env_factory

    (tmp_path / "probe_helpers.py").write_text(ENV)
    (tmp_path / "my_env.py").write_text("from probe_helpers import Probe\n\n"
                                        "def make_env():\n    return Probe()\n")
    spec = f"{tmp_path / 'my_env.py'}:make_env"
    assert load_env_factory(spec)().reset({"i": 4}) == [{"role": "user", "content": "row 4"}]
    pool = EnvWorkers(spec, 1, timeout=30.0)
    try:
        assert pool.factory().reset({"i": 5}) == [{"role": "user", "content": "row 5"}]
    finally:
        pool.close()


def test_score_in_a_worker_is_told_truncated_when_it_takes_it(tmp_path):
    """`truncated=` reaches a worker's environment whose score takes it; one without it is
    called with the messages alone (the Probe above, `test_state_stays_...`)."""
    (tmp_path / "told_env.py").write_text(ENV + '''
class Told(Probe):
    def score(self, messages, truncated=False):
        return [1.0 if truncated else 0.0]

def make_told():
    return Told()
''')
    spec = f"{tmp_path / 'told_env.py'}:make_told"
    pool = EnvWorkers(spec, 1, timeout=30.0)
    try:
        envs = [pool.factory() for _ in range(2)]
        call_envs(spec, "reset", envs, [({"i": 0},)] * 2, rows=[0, 0])
        said = _say("go")[0]
        assert call_envs(spec, "score", envs, [(said, True), (said, False)],
                         rows=[0, 0]) == [[1.0], [0.0]]
    finally:
        pool.close()
