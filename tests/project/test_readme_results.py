"""The README's results table is the committed report's own: every row stands verbatim in
docs/default/report.md (what `vpo compare` wrote), so they cannot drift apart, and the README
names the commit it came from (and the commits of docs/smollm/report.md, which it cites)."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _table(text: str, header: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize("report, header", [
    ("default", "| policy | m | seeds | best@1 | pass@1 | best@30 |")])
def test_the_readme_results_tables_are_the_committed_reports(report, header):
    readme = (ROOT / "README.md").read_text()
    text = (ROOT / "docs" / report / "report.md").read_text()
    ours, theirs = _table(readme, header), _table(text, header)
    assert len(ours) >= 3, f"the README's table of docs/{report}/report.md is missing"
    assert ours == theirs, f"re-copy the headline table of docs/{report}/report.md into the README"
    at = readme.replace("\n", " ").find(f"(docs/{report}/report.md), `vpo compare` at commit")
    assert at > 0, f"the README names the commit that produced docs/{report}/report.md"


def test_the_readme_names_the_commits_of_the_reports_it_cites():
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    for report in ("default", "maze", "smollm"):
        at = readme.find(f"(docs/{report}/report.md), `vpo compare` at commit")
        assert at > 0, f"the README names the commit that produced docs/{report}/report.md"
