"""The package's public surface: every exported name resolves, and `import vpo` stays light."""

import subprocess
import sys

import vpo


def test_every_exported_name_resolves():
    """Each name in `vpo.__all__` is the very object of the module its export table names."""
    import importlib

    for name in vpo.__all__:
        where = vpo._EXPORTS[name]
        module, attr = where if isinstance(where, tuple) else (where, name)
        assert getattr(vpo, name) is getattr(importlib.import_module(module), attr), name
    assert set(vpo.__all__) <= set(dir(vpo))


def test_importing_the_objective_does_not_load_the_model_or_the_cli():
    code = ("import sys, vpo; from vpo import vpo_advantages; "
            "print(sorted(m for m in sys.modules if m.startswith('vpo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = eval(out.stdout)  # a list of module names
    assert "vpo.objectives" in loaded
    for heavy in ("vpo.model.decoder", "vpo.cli.main", "vpo.run.loop", "vpo.compare.driver",
                  "vpo.io.hf"):
        assert heavy not in loaded, loaded


def test_exported_names_never_shadow_a_submodule():
    """`from vpo import rl` must give the subpackage even when nothing imported it before."""
    import pathlib

    root = pathlib.Path(vpo.__file__).parent
    submodules = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir()
                                                        if (p / "__init__.py").exists()}
    assert not set(vpo.__all__) & submodules
    code = "from vpo import rl, rollout; print(type(rl).__name__, rl.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["module", "vpo.rl"]


def test_earlier_import_paths_keep_working():
    """Users' code written against the flat layout: `vpo.objectives` and `vpo.evaluation`."""
    from vpo.eval import metrics
    from vpo.evaluation import best_at_k, pass_at_k, reward_diversity
    from vpo.objectives import grpo_advantages, policy_loss, vpo_advantages  # noqa: F401

    assert (pass_at_k, best_at_k, reward_diversity) == (
        metrics.pass_at_k, metrics.best_at_k, metrics.reward_diversity)
