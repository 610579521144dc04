"""The maps match the tree: every module docs/architecture.md and docs/modules.md name exists
(and a name after a module, `vpo.accel.program_report.plan`, is defined in it), every file path
they give exists, and docs/modules.md names every module of the package."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DOCS = ("docs/architecture.md", "docs/modules.md")
_FILE_SUFFIXES = (".json", ".jsonl", ".md", ".py", ".png", ".toml", ".txt", ".safetensors")


def _modules() -> dict[str, pathlib.Path]:
    """{dotted module name with the `vpo.` prefix: path}, kernels/ as `vpo.kernels`."""
    mods = {}
    for p in (ROOT / "vpo").rglob("*.py"):
        if "preset_data" in p.parts:  # the presets' data files, not modules
            continue
        parts = ("vpo",) + p.relative_to(ROOT / "vpo").with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    for p in (ROOT / "kernels").glob("*.py"):
        mods["vpo.kernels" if p.stem == "__init__" else f"vpo.kernels.{p.stem}"] = p
    return mods


def _defined(path: pathlib.Path) -> set[str]:
    """Names a module defines or imports at its top level (and `__all__`'s entries)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                out |= {e.value for e in getattr(node.value, "elts", [])
                        if isinstance(e, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def _dotted_names(text: str, units: set[str]) -> set[str]:
    """`vpo.x.y...` names, and `x.y...` names whose first part is a unit of the package (the
    architecture walk writes `rl.step` for `vpo.rl.step`), each with the `vpo.` prefix."""
    out = set()
    for m in re.finditer(r"(?<![\w./-])((?:vpo\.)?[a-z_][\w]*(?:\.[A-Za-z_][\w]*)+)", text):
        name = m.group(1)
        if name.endswith(_FILE_SUFFIXES) or text[m.end():m.end() + 1] in ("/", "-"):
            continue
        if not name.startswith("vpo."):
            if name.split(".")[0] not in units:
                continue
            name = "vpo." + name
        out.add(name)
    return out


def _resolve(name: str, mods) -> str | None:
    """Why `name` does not match the tree, or None: its longest module prefix must exist and
    the part after it be defined there."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if mod in mods:
            rest = parts[i:]
            if rest and rest[0] not in _defined(mods[mod]) | {"__all__"}:
                return f"{name}: {mod} has no {rest[0]}"
            return None
    return f"{name}: no such module"


def test_every_module_the_docs_name_exists():
    mods = _modules()
    units = {m.split(".")[1] for m in mods if m != "vpo"}
    bad = []
    for doc in DOCS:
        for name in sorted(_dotted_names((ROOT / doc).read_text(), units)):
            why = _resolve(name, mods)
            if why:
                bad.append(f"{doc}: {why}")
    assert not bad, "\n".join(bad)


def test_every_file_the_docs_name_exists():
    """Paths like `objectives/estimators.py` (under vpo/, or from the repository root)."""
    bad = []
    for doc in DOCS:
        for path in sorted(set(re.findall(r"`([\w/]+/[\w]+\.py)`", (ROOT / doc).read_text()))):
            if not ((ROOT / "vpo" / path).exists() or (ROOT / path).exists()):
                bad.append(f"{doc}: {path}")
    assert not bad, "\n".join(bad)


def test_modules_md_names_every_module():
    mods = _modules()
    text = (ROOT / "docs" / "modules.md").read_text()
    named = _dotted_names(text, set())
    missing = sorted(m for m in mods if m != "vpo"
                     and not any(n == m or n.startswith(m + ".") for n in named))
    assert not missing, f"name these modules in docs/modules.md: {missing}"


def test_every_module_a_docstring_or_page_names_exists():
    """`vpo.x.y` references in backticks anywhere (the package's docstrings and comments, the
    kernels, experiments, every docs page and the README) name a module of the tree, and a
    name after it is defined there: a moved module or function shows here."""
    mods = _modules()
    sources = [*(ROOT / "vpo").rglob("*.py"), *(ROOT / "kernels").glob("*.py"),
               *(ROOT / "experiments").glob("*.py"), *(ROOT / "docs").glob("*.md"),
               ROOT / "README.md"]
    bad = []
    for path in sources:
        for name in sorted(set(re.findall(r"`(vpo(?:\.[A-Za-z_]\w*)+)", path.read_text()))):
            why = _resolve(name, mods)
            if why:
                bad.append(f"{path.relative_to(ROOT)}: {why}")
    assert not bad, "\n".join(bad)
