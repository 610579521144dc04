"""The map stays true: every `vpo` import goes to the same or a lower layer of the table in
docs/architecture.md, every library module is in the table, and module-level imports have no
cycle."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _layers() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    out = {}
    for layer, mods in re.findall(r"^\| (\d+) \| (.+?) \|$", text, re.M):
        for m in mods.split(","):
            out[m.strip()] = int(layer)
    return out


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in (ROOT / "vpo").rglob("*.py"):
        parts = p.relative_to(ROOT / "vpo").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            mods[name] = p
    for p in (ROOT / "kernels").glob("*.py"):
        if p.stem != "__init__":
            mods[f"kernels.{p.stem}"] = p
    return mods


def _imports(path: pathlib.Path, known) -> tuple[set[str], set[str]]:
    """(all vpo modules imported anywhere in the file, those imported at module level)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    every, module_level = set(), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vpo"):
            base = node.module[4:]  # strip "vpo."
            names = [f"{base}.{a.name}".strip(".") for a in node.names]
            names = [n if n in known else base for n in names]
        elif isinstance(node, ast.Import):
            names = [a.name[4:] for a in node.names if a.name.startswith("vpo.")]
        names = [n.replace("kernels.", "kernels.", 1) for n in names if n in known]
        every.update(names)
        if id(node) in top:
            module_level.update(names)
    return every, module_level


def test_every_import_goes_to_the_same_or_a_lower_layer():
    layers, mods = _layers(), _modules()
    missing = sorted(set(mods) - set(layers))
    assert not missing, f"add these modules to the layer table of docs/architecture.md: {missing}"
    bad = []
    for name, path in mods.items():
        for dep in _imports(path, mods)[0] - {name}:
            if layers[dep] > layers[name]:
                bad.append(f"{name} (layer {layers[name]}) imports {dep} (layer {layers[dep]})")
    assert not bad, "\n".join(bad)


def test_module_level_imports_have_no_cycle():
    mods = _modules()
    graph = {n: _imports(p, mods)[1] - {n} for n, p in mods.items()}
    # the package `tasks` imports its task modules, which import siblings through the package
    graph = {n: {d for d in deps if not (d == "tasks" and n.startswith("tasks."))}
             for n, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(n, path):
        if state.get(n) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(path + [n])}")
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in graph[n]:
            visit(d, path + [n])
        state[n] = 2

    for n in graph:
        visit(n, [])
