"""Every committed docs/*/report.md is what this code renders from the summary.json beside it
(`vpo.compare.render.render`, a pure function of the summary): a change to the claim logic or
the report that would change a committed report fails here until the report is re-rendered
(`python experiments/rerender_compare.py docs/<name>/summary.json docs/<name>`)."""

import json
import pathlib

import pytest

from vpo.compare import render as compare_render

DOCS = pathlib.Path(__file__).resolve().parent.parent.parent / "docs"
# reports committed without their summary.json: they cannot be re-rendered, so they are known
# to be stale until the run that writes them is repeated and committed with its summary
WITHOUT_SUMMARY: dict[str, str] = {}


def _reports() -> list:
    out = []
    for path in sorted(DOCS.glob("*/report.md")):
        name = path.parent.name
        marks = ([pytest.mark.xfail(reason=WITHOUT_SUMMARY[name], strict=True)]
                 if name in WITHOUT_SUMMARY else [])
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _reports())
def test_the_committed_report_is_its_summary_rendered(name):
    summary = DOCS / name / "summary.json"
    assert summary.exists(), f"docs/{name}/report.md has no summary.json to render it from"
    want = compare_render.render(json.loads(summary.read_text()))
    got = (DOCS / name / "report.md").read_text()
    assert got == want, (f"docs/{name}/report.md differs from its rendering: run python "
                         f"experiments/rerender_compare.py docs/{name}/summary.json docs/{name}")


def test_every_report_without_a_summary_is_named():
    # a new report must come with its summary.json; only the listed ones may lack it
    lacking = {p.parent.name for p in DOCS.glob("*/report.md")
               if not (p.parent / "summary.json").exists()}
    assert lacking <= set(WITHOUT_SUMMARY), lacking


@pytest.mark.parametrize("name", _reports())
def test_every_figure_a_committed_report_links_is_committed(name):
    import re

    text = (DOCS / name / "report.md").read_text()
    missing = [f for f in re.findall(r"\]\(([\w./-]+\.png)\)", text)
               if not (DOCS / name / f).exists()]
    assert not missing, (f"docs/{name}/report.md links {missing}, not committed beside it: "
                         f"python experiments/rerender_compare.py docs/{name}/summary.json "
                         "OUT --figures writes them")

