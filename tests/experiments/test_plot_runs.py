"""experiments/plot_runs.py on runs whose reward functions differ: shared panels, no KeyError."""

import json
import os


def _run(folder, components, steps=12):
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            row = {"step": s, "step_time_s": 1.0 + s % 3, "reward": s / steps,
                   "entropy": 1.0 - s / steps, "response_length": 10.0 + s}
            row.update({f"reward/{c}": (s % 4) / 4 for c in components})
            f.write(json.dumps(row) + "\n")


def test_runs_with_different_reward_components_plot_together(tmp_path, capsys,
                                                              load_experiment):
    _run(tmp_path / "a", ["correct", "brevity"])
    _run(tmp_path / "b", ["correct", "format"])
    out = str(tmp_path / "both.png")
    load_experiment("plot_runs").main([str(tmp_path / "a"), str(tmp_path / "b"),
                                       "--out", out, "--window", "4"])
    assert os.path.getsize(out) > 0
    text = capsys.readouterr().out
    a, b = text.split("\nb: ")
    assert "reward/brevity" in a and "reward/format" not in a
    assert "reward/format" in b and "reward/brevity" not in b and "reward/correct" in b
