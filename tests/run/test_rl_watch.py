"""Warnings that a run is not learning: truncated completions and rewards equal in every group,
each raised once, from crafted rows and from a tiny run whose reward is always 0."""

import json
import os

from vpo.cli import main as cli
from vpo.run.watch import RunWatch


def test_truncation_warns_once_naming_the_setting():
    watch = RunWatch(12)
    assert watch.check({"step": 1, "truncation_rate": 0.25}) == []  # a quarter: not more
    [msg] = watch.check({"step": 2, "truncation_rate": 0.5})
    assert "50%" in msg and "raise sampler.max_new_tokens (now 12)" in msg
    assert watch.check({"step": 3, "truncation_rate": 1.0}) == []


def test_equal_rewards_warn_after_patience_steps_in_a_row():
    watch = RunWatch(64, patience=3)
    rows = [{"step": s, "zero_variance_frac": f}
            for s, f in enumerate([1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0], start=1)]
    fired = [(r["step"], watch.check(r)) for r in rows]
    assert [s for s, w in fired if w] == [6]  # the streak broken at step 3 restarts
    msg = fired[5][1][0]
    assert "every group's rewards were equal for 3 steps: no learning signal" in msg
    assert "check your reward functions / the answer format / temperature" in msg
    assert watch.check({"step": 8, "zero_variance_frac": 1.0}) == []  # once per run


def test_rows_without_the_metrics_raise_nothing():
    watch = RunWatch(64, patience=1)
    assert watch.check({"step": 1, "loss": 0.0}) == []


ZERO_REWARD = '''
def zero(completions, **kwargs):
    return [0.0] * len(completions)
'''


def test_a_run_with_a_constant_reward_warns_once_each(tmp_path, capsys):
    bpe = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)})
                            + "\n" for i in range(4)))
    rewards = tmp_path / "const_reward.py"
    rewards.write_text(ZERO_REWARD)
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", str(data), "--reward", f"{rewards}:zero",
                     f"model=hf:{bpe}", "train.batch_size=8", "sampler.num_samples=2",
                     "sampler.max_new_tokens=10", "train.steps=6", "train.sample_every=0",
                     "--report-to", "none", "--out", out]) == 0
    err = capsys.readouterr().err
    assert err.count("raise sampler.max_new_tokens (now 10)") == 1
    assert err.count("every group's rewards were equal for 5 steps: no learning signal") == 1
    assert not os.path.exists(os.path.join(out, "tb"))  # --report-to none: JSONL only
    assert os.path.exists(os.path.join(out, "metrics.jsonl"))
