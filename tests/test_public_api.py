"""The package's public surface: every exported name resolves, and `import vpo` stays light."""

import subprocess
import sys

import vpo


def test_every_exported_name_resolves():
    for name in vpo.__all__:
        assert getattr(vpo, name) is not None, name
    assert set(vpo.__all__) <= set(dir(vpo))


def test_importing_the_objective_does_not_load_the_model_or_the_cli():
    code = ("import sys, vpo; from vpo import vpo_advantages; "
            "print(sorted(m for m in sys.modules if m.startswith('vpo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = eval(out.stdout)  # a list of module names
    assert "vpo.objectives" in loaded
    for heavy in ("vpo.model", "vpo.cli", "vpo.loop", "vpo.compare", "vpo.hf"):
        assert heavy not in loaded, loaded


def test_library_modules_never_import_the_cli_or_the_compare_driver():
    import pathlib
    import re

    root = pathlib.Path(vpo.__file__).parent
    pat = re.compile(r"^\s*(from vpo(\.cli|\.compare)? import (cli|compare)\b|"
                     r"from vpo\.(cli|compare) import|import vpo\.(cli|compare))", re.M)
    for path in root.rglob("*.py"):
        if path.name in ("cli.py", "compare.py", "__init__.py"):  # the drivers themselves
            continue
        assert not pat.search(path.read_text()), path


def test_exported_names_never_shadow_a_submodule():
    """`from vpo import train` must give the module even when nothing imported it before."""
    import pathlib

    root = pathlib.Path(vpo.__file__).parent
    submodules = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir()
                                                        if (p / "__init__.py").exists()}
    assert not set(vpo.__all__) & submodules
    code = "from vpo import train, sampler; print(type(train).__name__, train.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["module", "vpo.train"]
