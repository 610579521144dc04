"""The map stays true: the package's units (subpackages, the core modules and the kernels) import
only from lower layers of the table in docs/architecture.md, every unit is in the table,
imports (those inside functions too) have no cycle, and no private name (`_x`) is used across
units, in the library or in experiments/."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _layers() -> dict[str, int]:
    """{unit: layer} from the rows `| layer | `unit`, `unit` | job |` of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    out = {}
    for layer, units in re.findall(r"^\| (\d+) \| ((?:`[\w.]+`(?:, )?)+) \|", text, re.M):
        for u in re.findall(r"`([\w.]+)`", units):
            out[u] = int(layer)
    return out


def _modules() -> dict[str, pathlib.Path]:
    """{dotted name without the `vpo.` prefix: path} of every library module."""
    mods = {}
    for p in (ROOT / "vpo").rglob("*.py"):
        parts = p.relative_to(ROOT / "vpo").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            mods[name] = p
    for p in (ROOT / "kernels").glob("*.py"):
        mods["kernels" if p.stem == "__init__" else f"kernels.{p.stem}"] = p
    return mods


def _unit(module: str) -> str:
    """The unit a module belongs to: its subpackage, or itself for a top-level module."""
    return module.split(".")[0]


def _imports(path: pathlib.Path, known) -> tuple[set[str], set[str], dict[str, str]]:
    """(vpo modules imported anywhere in the file, those imported at module level,
    {local alias: module} of imported modules)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    every, module_level, aliases = set(), set(), {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "vpo" or node.module.startswith("vpo.")):
            base = node.module[4:]
            for a in node.names:
                full = f"{base}.{a.name}".strip(".")
                if full in known:
                    aliases[a.asname or a.name] = full
                    names.append(full)
                else:
                    names.append(base)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("vpo."):
                    names.append(a.name[4:])
                    if a.asname:
                        aliases[a.asname] = a.name[4:]
        names = [n for n in names if n in known]
        every.update(names)
        if id(node) in top:
            module_level.update(names)
    return every, module_level, aliases


def test_every_unit_imports_only_lower_layers():
    layers, mods = _layers(), _modules()
    missing = sorted({_unit(m) for m in mods} - set(layers))
    assert not missing, f"add these units to the layer table of docs/architecture.md: {missing}"
    bad = []
    for name, path in mods.items():
        for dep in _imports(path, mods)[0]:
            a, b = _unit(name), _unit(dep)
            if a != b and layers[b] >= layers[a]:
                bad.append(f"{name} ({a}, layer {layers[a]}) imports {dep} ({b}, layer "
                           f"{layers[b]})")
    assert not bad, "\n".join(bad)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` ({node: nodes it points to}) as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        state[n] = 2
        path.pop()
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_imports_have_no_cycle():
    """The import graph of every module (the kernels as `vpo.kernels`), imports inside
    functions included, has no cycle: a module that builds on another is never imported by it
    (the base does not reach for its extension; the caller picks). A module's import of its own
    package (`from vpo.rl import x` inside `vpo.rl.*`) is not an edge: the package is already
    being imported. Units (subpackages, core modules, kernels) cannot form a cycle: each
    imports only lower layers (test_every_unit_imports_only_lower_layers)."""
    mods = _modules()
    graph = {n: {d for d in _imports(p, mods)[0] - {n} if not n.startswith(d + ".")}
             for n, p in mods.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _private_uses(path: pathlib.Path, unit: str | None, mods) -> list[str]:
    """`from vpo.x import _y` and `x._y` where x is a vpo module of another unit than `unit`."""
    tree = ast.parse(path.read_text())
    _, _, aliases = _imports(path, mods)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vpo."):
            src = node.module[4:]
            if src in mods and _unit(src) != unit:
                out += [f"{path.name}: from vpo.{src} import {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and _unit(aliases[node.value.id]) != unit):
            out.append(f"{path.name}: {node.value.id}.{node.attr}")
    return out


def test_no_private_name_is_used_across_units():
    mods = _modules()
    bad = []
    for name, path in mods.items():
        bad += _private_uses(path, _unit(name), mods)
    for path in (ROOT / "experiments").glob("*.py"):
        bad += _private_uses(path, None, mods)
    assert not bad, "\n".join(bad)


def test_no_module_over_450_lines_without_a_stated_reason():
    """A module past ~450 lines says why in a `# size:` line (one job that is long), or splits."""
    mods = _modules()
    long = [f"{n} ({len(p.read_text().splitlines())} lines)" for n, p in mods.items()
            if len(p.read_text().splitlines()) > 450 and "# size:" not in p.read_text()]
    assert not long, f"split these modules or state why they are long ('# size: ...'): {long}"


# Functions of vpo/ allowed past MAX_FUNCTION_LINES, each with its reason.
LONG_FUNCTIONS: dict[str, str] = {
    "vpo/env/episode.py:run_episodes": "one loop over turns whose state (cache, masks, "
    "budgets) every stage reads; not yet split into named stages (115 code lines)",
    "vpo/compare/config.py:CompareConfig.__post_init__": "the compare config's checks, written "
    "by hand rather than as Rule tables; not yet grouped into sub-configs (107 code lines)",
    "vpo/tasks/codeword.py:make_codeword_task": "the task's jitted reader, reward and prompt "
    "closures share its arguments (82 code lines)",
}
MAX_FUNCTION_LINES = 80


def _code_lines(path: pathlib.Path) -> list[tuple[str, int]]:
    """(qualified name, code lines) of every function in the file: lines that are not blank,
    not comments and not part of a docstring (a nested function's lines count in its outer
    one too)."""
    text = path.read_text()
    tree, lines = ast.parse(text), text.splitlines()
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = sum(1 for i in range(child.lineno, child.end_lineno + 1)
                        if i not in docs and lines[i - 1].strip()
                        and not lines[i - 1].strip().startswith("#"))
                out.append((prefix + child.name, n))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


def test_no_function_in_vpo_over_80_code_lines():
    """Code grows by named stages, not by branches in one function: no function of vpo/ has
    more than 80 code lines (blank, comment and docstring lines not counted), but those in
    LONG_FUNCTIONS, each with its reason; an entry no longer over the bound must go."""
    long, listed = [], set()
    for path in sorted((ROOT / "vpo").rglob("*.py")):
        for name, n in _code_lines(path):
            where = f"{path.relative_to(ROOT)}:{name}"
            if n > MAX_FUNCTION_LINES:
                (listed.add if where in LONG_FUNCTIONS else long.append)(where)
    assert not long, (f"split these functions into named stages (or state why one is long in "
                      f"LONG_FUNCTIONS): {long}")
    assert listed == set(LONG_FUNCTIONS), f"no longer long: {set(LONG_FUNCTIONS) - listed}"


def test_every_subpackage_ships_in_the_distribution():
    """pyproject's explicit `packages` list names every subpackage (a missing one installs
    only in editable mode)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {"vpo." + ".".join(p.parent.relative_to(ROOT / "vpo").parts)
             for p in (ROOT / "vpo").rglob("__init__.py")} | {"vpo.kernels"}
    found = {f.rstrip(".") for f in found}
    assert found == listed, f"add to pyproject's packages: {sorted(found - listed)}; " \
                            f"remove: {sorted(listed - found)}"


# Modules outside vpo/tasks and vpo/env allowed to ask a task its kind by name, each with its
# reason (none: a caller dispatches on the bound task's type, `vpo.tasks.bound.for_kind`).
KIND_QUESTIONS: dict[str, str] = {}


def test_task_kinds_are_types_outside_tasks_and_env():
    """A task's kind is the type of its bound task (`GraphTask`, `HostTask`, `EnvTask`):
    outside vpo/tasks and vpo/env no module asks `is_env_task(...)` or `task.is_host`; a caller
    with one function per kind looks it up once in a table keyed by the type, and a yes/no that
    depends on the kind is an attribute or method of the type."""
    asks = re.compile(r"\bis_env_task\b|\.is_host\b")
    bad = []
    for path in sorted((ROOT / "vpo").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("vpo/tasks/", "vpo/env/")) or rel in KIND_QUESTIONS:
            continue
        bad += [f"{rel}:{i}: {line.strip()}"
                for i, line in enumerate(path.read_text().splitlines(), 1) if asks.search(line)]
    assert not bad, ("dispatch on the task's type (vpo.tasks.bound.for_kind, isinstance) "
                     "instead:\n" + "\n".join(bad))


def test_every_bound_task_class_is_of_a_kind():
    """The kind tables (`vpo.tasks.bound.for_kind`) know GraphTask, HostTask and their
    subclasses: a class of the package derived from BoundTask directly would be refused by
    every table (as `compare.data.DataPart` was), so only the kinds themselves may do so."""
    direct = []
    for path in sorted((ROOT / "vpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                     for b in getattr(node, "bases", [])]
            if isinstance(node, ast.ClassDef) and "BoundTask" in bases \
                    and node.name not in ("GraphTask", "HostTask"):
                direct.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not direct, ("derive from GraphTask or HostTask (the task's kind), not BoundTask:\n"
                        + "\n".join(direct))


def _shape_key() -> dict[str, str]:
    """{letter: meaning} of the dimension key in vpo/types.py's docstring (`B prompts · ...`)."""
    doc = ast.get_docstring(ast.parse((ROOT / "vpo" / "types.py").read_text()))
    key = doc.split("Dimension key", 1)[1].split("):", 1)[1].split("\n\n")[0]
    key = key.split("`tests/", 1)[0]
    items = [" ".join(item.split()) for item in key.split("·")]
    return dict((item.split(" ", 1) + [""])[:2] for item in items)


def test_shape_key_gives_each_letter_one_meaning():
    """The key in vpo/types.py names each letter once, one capital letter per entry, each with
    its meaning: a second meaning of a letter is a new letter, never a second entry."""
    doc = ast.get_docstring(ast.parse((ROOT / "vpo" / "types.py").read_text()))
    key = doc.split("Dimension key", 1)[1].split("):", 1)[1].split("`tests/", 1)[0]
    letters = [item.split()[0] for item in key.split("·")]
    bad = [x for x in letters if not re.fullmatch(r"[A-Z]", x)]
    repeated = sorted({x for x in letters if letters.count(x) > 1})
    assert not bad and not repeated, f"entries not one letter: {bad}; letters twice: {repeated}"
    assert all(_shape_key().values()), "every letter of the key has its meaning"


def test_shape_letters_table_follows_the_key():
    """docs/architecture.md#shape-letters lists the key's letters, each once."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Shape letters", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z])` \|", section, re.M)
    assert sorted(rows) == sorted(_shape_key()) and len(rows) == len(set(rows)), (
        f"table {''.join(rows)} vs key {''.join(sorted(_shape_key()))}")


# Letters of the key that a module still uses with a meaning of its own, {(module, letter):
# that meaning}: each to be renamed to the key's letter for it (the test below fails once a
# module no longer uses the letter, so the entry goes with the last such name).
SHAPE_LETTER_LOCAL: dict[tuple[str, str], str] = {
    ("tasks.answers", "X"): "bytes of a completion",
}
_SHAPE_NAME = re.compile(r"^(?=\w*[a-z])\w*_([A-Z]+)$")


def _shape_names(path: pathlib.Path) -> set[str]:
    """Every shape-suffixed name a file binds or reads (`logp_BGT`), ALL_CAPS constants left out."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        else:
            continue
        out |= {n for n in names if _SHAPE_NAME.match(n)}
    return out


def test_shape_suffixes_use_the_letters_of_the_key():
    """Every shape suffix in the package (kernels included) uses only letters of the dimension
    key in vpo/types.py (docs/architecture.md#shape-letters)."""
    key, bad = _shape_key(), []
    for name, path in sorted(_modules().items()):
        for n in sorted(_shape_names(path)):
            other = {c for c in _SHAPE_NAME.match(n).group(1) if c not in key}
            if other:
                bad.append(f"{name}: {n} ({', '.join(sorted(other))})")
    assert not bad, (f"letters outside vpo/types.py's key {''.join(sorted(key))}: add the "
                     f"dimension to the key or rename: {bad}")


def test_local_shape_meanings_are_still_there():
    """SHAPE_LETTER_LOCAL names modules of the package and key letters each still uses: an
    entry whose module no longer has a name with that letter is done, and leaves the table."""
    mods, key, stale = _modules(), _shape_key(), []
    for (name, letter), meaning in sorted(SHAPE_LETTER_LOCAL.items()):
        used = {c for n in _shape_names(mods[name]) for c in _SHAPE_NAME.match(n).group(1)} \
            if name in mods else set()
        if letter not in key or letter not in used or not meaning:
            stale.append(f"{name}: {letter}")
    assert not stale, f"SHAPE_LETTER_LOCAL entries with nothing left to rename: {stale}"


def test_tests_mirror_the_package():
    """Each folder of tests/ is a subpackage of vpo (or kernels, project, experiments,
    fixtures), and a test at the top of tests/ tests a top-level module of vpo."""
    tests = ROOT / "tests"
    allowed = {p.parent.name for p in (ROOT / "vpo").glob("*/__init__.py")}
    allowed |= {"kernels", "project", "experiments", "fixtures"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= allowed, f"tests/ folders that mirror nothing: {sorted(folders - allowed)}"
    top = {p.stem for p in (ROOT / "vpo").glob("*.py")}
    stray = [p.name for p in tests.glob("test_*.py") if p.stem[len("test_"):] not in top]
    assert not stray, f"tests at the top of tests/ for no top-level vpo module: {stray}"
