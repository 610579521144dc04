"""The README's results table is the committed report's own: every row of it stands verbatim in
docs/default/report.md (what `vpo compare` wrote), so the two cannot drift apart."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _table(text: str, header: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_results_table_is_the_committed_reports():
    readme = (ROOT / "README.md").read_text()
    report = (ROOT / "docs" / "default" / "report.md").read_text()
    header = "| policy | m | seeds |"
    ours, theirs = _table(readme, header), _table(report, header)
    assert len(ours) >= 3, "the README's results table is missing"
    assert ours == theirs, "re-copy the headline table of docs/default/report.md into the README"
    commit = re.search(r"`vpo compare` at commit ([0-9a-f]{7,})", readme)
    assert commit, "the README names the commit that produced the table"
