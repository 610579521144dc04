"""The temperature sweep's report section, on hand-made records: the main temperature read from
the search stage, the sweep's from its own records, paired by seed."""

import numpy as np
import pytest

from vpo.compare import temperature_report


def _stage_row(seed, solved, best_of_n, probe):
    """A search-stage record with one search: `solved` / `best_of_n` problems of 4 solved."""
    return {"seed": seed, "solved_SP": [[i < solved for i in range(4)]],
            "best_of_n_SP": [[i < best_of_n for i in range(4)]], "probe": probe}


@pytest.fixture
def summary():
    searches = {"problems": [3, 5, 7, 9], "seeds": 1, "rows": {
        "sft (m=1)": [_stage_row(0, 2, 1, [10, 2, 10, 1]), _stage_row(1, 2, 0, [10, 2, 10, 1])],
        "grpo": [_stage_row(0, 1, 1, [10, 1, 10, 1]), _stage_row(1, 0, 0, [10, 1, 10, 1])],
        "vpo": [_stage_row(1, 3, 2, [10, 3, 10, 1]), _stage_row(0, 2, 1, [10, 3, 10, 1])]}}
    sweep = {"temperatures": [1.3], "main": 0.7, "point": 2, "budget": 24, "rows": {
        name: [{"temperature": 1.3, "seed": s, "m": 1, "search": x, "best_of_n": y,
                "probe": [20, 4, 20, 2]} for s, x, y in vals]
        for name, vals in {"sft (m=1)": [(0, 3, 1), (1, 3, 2)], "grpo": [(1, 3, 0), (0, 2, 1)],
                           "vpo": [(0, 3, 2), (1, 4, 2)]}.items()}}
    return sweep, searches


def test_points_join_the_search_stage_and_the_sweep_by_seed(summary):
    sweep, searches = summary
    pts = temperature_report.points(sweep, searches)
    assert list(pts["grpo"]) == [0.7, 1.3]
    assert pts["grpo"][0.7] == {"seeds": [0, 1], "search": [1.0, 0.0], "best_of_n": [1.0, 0.0],
                                "probe": [20, 2, 20, 2]}
    assert pts["grpo"][1.3]["seeds"] == [0, 1] and pts["grpo"][1.3]["search"] == [2, 3]
    assert pts["vpo"][0.7]["search"] == [2.0, 3.0]  # the stage's rows sorted by seed


def test_the_section_reports_paired_differences_and_probe_rates(summary):
    sweep, searches = summary
    text = "\n".join(temperature_report.lines(sweep, searches))
    assert "## Search temperature (exploratory)" in text
    # grpo at 1.3: island [2, 3], best-of-N [1, 0] -> gain [1, 3], both seeds above zero;
    # probe 4/20 children and 2/20 fresh samples beat their parents
    row = next(line for line in text.splitlines() if line.startswith("| grpo | 1.3 |"))
    assert "| 2.50 | 0.50 | +2.00 (2+/0-) | 0.200 | 0.100 |" in row  # 2 seeds: no interval
    # vpo - grpo at 0.7: [2-1, 3-0] = [1, 3]; grpo at 1.3 - vpo at 0.7: [2-2, 3-3] = 0
    assert "- vpo at 0.7 − grpo at 0.7: +2.00" in text
    assert "- grpo at 1.3 − vpo at 0.7: +0.00 (0+/0-)" in text


def test_unpaired_seeds_are_refused(summary):
    sweep, searches = summary
    sweep["rows"]["vpo"][0]["seed"] = 5
    with pytest.raises(ValueError, match="not paired"):
        temperature_report.lines(sweep, searches)


def test_the_figure_is_written(summary, tmp_path):
    sweep, searches = summary
    name = temperature_report.write_figure(str(tmp_path), sweep, searches)
    assert (tmp_path / name).stat().st_size > 0
    assert np.isfinite(temperature_report.points(sweep, searches)["vpo"][1.3]["search"]).all()
