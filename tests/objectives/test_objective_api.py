"""The objective as a library: the documented blocks run, one return and key convention, the
estimators by name with the table's defaults, one policy for bad values, TRL's flat layout, the
published loss settings, a light import."""

import pathlib
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vpo
from vpo import objectives as obj
from vpo.config import ObjectiveConfig
from vpo.errors import RewardError
from vpo.objectives import estimators

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python_blocks(text: str) -> list[str]:
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


@pytest.mark.parametrize("source", ["docs/objective.md", "docs/modules.md",
                                    "vpo.objectives", "vpo.search.ingraph.make_search"])
def test_documented_python_blocks_run(source):
    """Every ```python block of the page (or docstring) runs, in order, in one namespace."""
    import importlib

    if source.endswith(".md"):
        text = (ROOT / source).read_text()
    elif source.endswith(".make_search"):
        text = importlib.import_module("vpo.search.ingraph").make_search.__doc__
    else:
        text = importlib.import_module(source).__doc__
    blocks = python_blocks(text)
    assert blocks, source
    namespace: dict = {}
    with jax.numpy_rank_promotion("allow"):  # users' code runs under the default
        for block in blocks:
            exec(compile(block, source, "exec"), namespace)


def test_package_docstring_names_resolve():
    """Every dotted `vpo...` name in the package docstring imports, and none is `vpo.train`."""
    import importlib

    names = set(re.findall(r"`(vpo(?:\.\w+)+)`", vpo.__doc__))
    assert "vpo.train" not in names
    with pytest.raises(ImportError):
        exec("from vpo import train", {})
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            importlib.import_module(name)
        except ImportError:
            assert hasattr(importlib.import_module(module), attr), name
    for name in ("get_estimator", "LOSS_SETTINGS", "to_groups", "from_groups"):
        assert getattr(vpo, name) is getattr(obj, name)


def rewards(seed=0, shape=(3, 4, 2, 2)):
    return jax.random.uniform(jax.random.key(seed), shape)


INPUTS = {  # estimator name -> (rewards, solution_mask_BGM)
    "scalar": lambda: (rewards()[:, :, 0, 0], None),
    "components": lambda: (rewards()[:, :, 0], None),
    "vectors": lambda: (rewards(), jnp.ones((3, 4, 2), bool)),
    "correct": lambda: (rewards()[:, :, 0, 0] > 0.5, None),
}


@pytest.mark.parametrize("name", obj.estimator_names())
def test_every_estimator_by_name_returns_advantages_and_metrics(name):
    est = obj.get_estimator(name)
    x, smask = INPUTS[est.sees]()
    adv, metrics = est(jax.random.key(1), x, smask)
    assert adv.shape == (3, 4) and bool(jnp.all(jnp.isfinite(adv)))
    assert int(metrics["adv/nonfinite_rewards"]) == 0
    # the RL step's table goes through the same function with the config's defaults
    cfg = ObjectiveConfig(advantage=name)
    adv_cfg, _ = estimators.ESTIMATORS[name].fn(cfg, x, smask, jnp.full((2,), 0.5),
                                               jax.random.key(1))
    if name != "gdpo":  # the table hands GDPO the fixed scalarisation weights
        np.testing.assert_allclose(adv_cfg, adv, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", obj.estimator_names())
def test_one_default_per_option_in_function_and_table(name):
    defaults = obj.estimator_options(name)
    cfg = ObjectiveConfig(advantage=name)
    for option, field in estimators._SPECS[name].fields.items():
        assert defaults[option] == getattr(cfg, field), (name, option, field)
    with pytest.raises(ValueError, match="unknown"):
        obj.get_estimator(name, not_an_option=1)
    with pytest.raises(ValueError, match="known: grpo"):
        obj.get_estimator("nope")


def test_maxk_default_is_the_tables():
    r = rewards()[:, :, 0, 0]
    table, _ = estimators.ESTIMATORS["maxk"].fn(ObjectiveConfig(advantage="maxk"), r, None,
                                                None, None)
    np.testing.assert_allclose(obj.max_at_k_advantages(r)[0], table, rtol=1e-6)
    assert obj.estimator_options("maxk")["std_normalize"] is True


def test_key_first_and_the_earlier_keyword_form():
    key, r, m = jax.random.key(0), rewards(), jnp.ones((3, 4, 2), bool)
    new, _ = obj.vpo_advantages(key, r, m)
    with pytest.warns(DeprecationWarning, match="pass the key first"):
        old, _ = obj.vpo_advantages(r, m, key=key)
    np.testing.assert_array_equal(new, old)
    comps = r[:, :, 0]
    with pytest.warns(DeprecationWarning):
        old_rw, _ = obj.random_weight_grpo_advantages(comps, key=key)
    np.testing.assert_array_equal(obj.random_weight_grpo_advantages(key, comps)[0], old_rw)
    w = obj.dirichlet_weights(key, 3, 8, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # explicit weights: no key, no warning
        a, _ = obj.vpo_advantages(r, m, weights_BKR=w)
        b, _ = obj.vpo_advantages(None, r, m, weights_BKR=w)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="unexpected keyword"):
        obj.vpo_advantages(key, r, m, keys=key)
    with pytest.raises(TypeError, match="positionally"):
        obj.vpo_advantages(key, r, m, key=key)


def with_nan(x, index):
    return jnp.asarray(x, jnp.float32).at[index].set(jnp.nan)


@pytest.mark.parametrize("name", obj.estimator_names())
def test_nonfinite_rewards_raise_eagerly_and_give_nan_groups_under_jit(name):
    est = obj.get_estimator(name)
    x, smask = INPUTS[est.sees]()
    bad = with_nan(x, (0, 1, 0) if est.sees == "vectors" else (0, 1))  # one answer / rollout
    with pytest.raises(RewardError, match="non-finite"):
        est(jax.random.key(0), bad, smask)
    adv, metrics = jax.jit(est)(jax.random.key(0), bad, smask)
    assert int(metrics["adv/nonfinite_rewards"]) == 1
    assert bool(jnp.all(jnp.isnan(adv[0])))
    whole_batch = name == "gdpo"  # GDPO whitens over the batch
    assert bool(jnp.all(jnp.isnan(adv[1:]))) if whole_batch else \
        bool(jnp.all(jnp.isfinite(adv[1:])))
    # padding may hold NaN: it is ignored, eagerly too
    mask_BG = jnp.ones((3, 4), bool).at[0, 1].set(False)
    adv, metrics = est(jax.random.key(0), bad, smask, mask_BG=mask_BG)
    assert bool(jnp.all(jnp.isfinite(adv))) and adv[0, 1] == 0
    assert int(metrics["adv/nonfinite_rewards"]) == 0


def test_grpo_batch_scale_nan_reaches_every_group():
    adv, _ = jax.jit(lambda r: obj.grpo_advantages(r, scale="batch"))(
        with_nan(rewards()[:, :, 0, 0], (0, 1)))
    assert bool(jnp.all(jnp.isnan(adv)))


def test_invalid_vpo_answers_may_hold_nan():
    r = with_nan(rewards(), (0, 1, 1, 0))
    m = jnp.ones((3, 4, 2), bool).at[0, 1, 1].set(False)
    adv, metrics = obj.vpo_advantages(jax.random.key(0), r, m)
    assert bool(jnp.all(jnp.isfinite(adv))) and int(metrics["adv/nonfinite_rewards"]) == 0


def test_traced_alpha_at_most_zero_gives_nan():
    r = rewards()
    vpo = jax.jit(lambda a: obj.vpo_advantages(jax.random.key(0), r, jnp.ones((3, 4, 2), bool),
                                               alpha=a)[0])
    rw = jax.jit(lambda a: obj.random_weight_grpo_advantages(jax.random.key(0), r[:, :, 0],
                                                             alpha=a)[0])
    for f in (vpo, rw):
        assert bool(jnp.all(jnp.isnan(f(-1.0)))) and bool(jnp.all(jnp.isfinite(f(0.5))))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        obj.vpo_advantages(jax.random.key(0), r, jnp.ones((3, 4, 2), bool), alpha=0.0)


def test_weights_off_the_simplex_raise_eagerly_and_are_counted_under_jit():
    r, m = rewards(), jnp.ones((3, 4, 2), bool)
    w = jnp.asarray([[[0.7, 0.7], [0.5, 0.5]]] * 3)  # row 0 sums to 1.4
    with pytest.raises(ValueError, match="simplex"):
        obj.vpo_advantages(r, m, weights_BKR=w)
    _, metrics = jax.jit(lambda w: obj.vpo_advantages(r, m, weights_BKR=w))(w)
    assert int(metrics["adv/bad_weights"]) == 3
    with pytest.raises(ValueError, match="simplex"):
        obj.random_weight_grpo_advantages(None, r[:, :, 0], weights_BR=w[:, 0])


def test_rewards_outside_unit_range_are_accepted_and_affine_invariant():
    key, r, m = jax.random.key(0), rewards(), jnp.ones((3, 4, 2), bool)
    for name in ("grpo", "vpo"):
        est = obj.get_estimator(name, std="population") if name == "grpo" else \
            obj.get_estimator(name)
        x = r if name == "vpo" else r[:, :, 0, 0]
        a, _ = est(key, x, m)
        b, _ = est(key, 5.0 * x - 3.0, m)
        np.testing.assert_allclose(a, b, atol=2e-4)


def test_trl_flat_layout_round_trip():
    x_N = jnp.arange(24.0).reshape(12, 2)
    x_BG = obj.to_groups(x_N, num_generations=4)
    assert x_BG.shape == (3, 4, 2) and float(x_BG[1, 0, 0]) == 8.0  # consecutive rows
    np.testing.assert_array_equal(obj.from_groups(x_BG), x_N)
    with pytest.raises(ValueError, match="multiple of num_generations=5"):
        obj.to_groups(x_N, 5)


def test_vpo_loss_settings_are_the_compare_arms():
    from vpo.compare.config import paper_objective

    cfg = paper_objective()
    for field, value in obj.LOSS_SETTINGS["vpo"].items():
        assert getattr(cfg, field) == value, field
    assert obj.VPO_PAPER_LOSS is obj.LOSS_SETTINGS["vpo"]
    with pytest.raises(TypeError):
        obj.LOSS_SETTINGS["vpo"]["kl_coef"] = 0.0  # read-only


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "vpo"])
def test_every_loss_setting_is_accepted_by_policy_loss(name):
    z = jnp.zeros((1, 2, 3))
    loss, _ = obj.policy_loss(z, z, jnp.asarray([[1.0, -1.0]]), jnp.ones((1, 2, 3), bool),
                              ref_logp_BGT=z, **obj.LOSS_SETTINGS[name])
    assert bool(jnp.isfinite(loss))


def test_the_step_reads_the_loss_settings_the_objective_names():
    """`objectives.loss_options` reads every loss keyword an `ObjectiveConfig` sets, and each
    named field exists on the config: the step passes them without copying names by hand."""
    import dataclasses
    import inspect

    fields = {f.name for f in dataclasses.fields(ObjectiveConfig)}
    assert set(obj.LOSS_FIELDS) <= fields, sorted(set(obj.LOSS_FIELDS) - fields)
    keywords = set(inspect.signature(obj.policy_loss).parameters)
    assert keywords & fields == set(obj.LOSS_FIELDS), sorted(keywords & fields ^ set(
        obj.LOSS_FIELDS))
    cfg = ObjectiveConfig(clip_eps_high=0.28, kl_coef=0.01)
    opts = obj.loss_options(cfg)
    assert opts == {name: getattr(cfg, name) for name in obj.LOSS_FIELDS}
    z = jnp.zeros((1, 2, 3))
    loss, _ = obj.policy_loss(z, z, jnp.asarray([[1.0, -1.0]]), jnp.ones((1, 2, 3), bool),
                              ref_logp_BGT=z, entropy_BGT=z, key=jax.random.key(0), **opts)
    assert bool(jnp.isfinite(loss))


def test_the_objective_imports_and_runs_without_the_trainers_dependencies():
    """What `pip install --no-deps vpo && pip install jax numpy` gives: flax, optax, orbax, ...
    missing. The objective imports and the vector-rewards example runs."""
    blocked = ("flax", "optax", "orbax", "chex", "grain", "tensorboardX", "matplotlib",
               "tokenizers", "safetensors", "jinja2", "tqdm")
    code = textwrap.dedent(f"""
        import sys, runpy
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from vpo import vpo_advantages, objectives
        runpy.run_path("examples/objective/vpo_vector_rewards.py", run_name="__main__")
        print(sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("[]")


def test_py_typed_ships():
    import tomllib

    assert (ROOT / "vpo" / "py.typed").exists()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["vpo"]


def test_the_decoder_is_a_sampler_model():
    from flax import nnx

    from vpo.config import model_preset
    from vpo.model.decoder import Decoder
    from vpo.rollout.sampler import SamplerModel, check_sampler_model

    model = Decoder(model_preset("tiny"), rngs=nnx.Rngs(0))
    assert isinstance(model, SamplerModel)
    check_sampler_model(model)


def test_one_mask_convention_for_vpo_function_and_estimator():
    """The answer mask is optional in `vpo_advantages` and its estimator form; None = all valid."""
    key, r = jax.random.key(0), rewards()
    full, _ = obj.vpo_advantages(key, r, jnp.ones((3, 4, 2), bool))
    for adv in (obj.vpo_advantages(key, r)[0], obj.vpo_advantages(key, r, None)[0],
                obj.get_estimator("vpo")(key, r)[0], obj.get_estimator("vpo")(key, r, None)[0],
                obj.vpo_advantages(key, r, mask_BG=None)[0]):
        np.testing.assert_array_equal(adv, full)
    np.testing.assert_allclose(jax.jit(obj.vpo_advantages)(key, r)[0], full, atol=1e-5)
    w = obj.dirichlet_weights(key, 3, 8, 2)
    np.testing.assert_array_equal(obj.vpo_advantages(r, weights_BKR=w)[0],
                                  obj.vpo_advantages(None, r, None, weights_BKR=w)[0])
    np.testing.assert_array_equal(obj.expected_max(r, None, w),
                                  obj.expected_max(r, jnp.ones((3, 4, 2), bool), w))


def test_a_missing_key_names_the_first_argument():
    r = rewards()
    with pytest.raises(TypeError, match=r"first argument; got a float32 array of shape "
                                        r"\(3, 4, 2, 2\).*jax.random.key"):
        obj.vpo_advantages(r, jnp.ones((3, 4, 2), bool))
    with pytest.raises(TypeError, match="the key and 1 to 2 array"):
        obj.vpo_advantages(jax.random.key(0))
    # a raw uint32[2] key (jax.random.PRNGKey) is a key too
    raw, _ = obj.vpo_advantages(jax.random.PRNGKey(0), r)
    assert raw.shape == (3, 4)


@pytest.mark.parametrize("fn", [obj.grpo_advantages, obj.rloo_advantages, obj.maxrl_advantages,
                                obj.max_at_k_advantages, obj.best_of_group_advantages,
                                obj.pass_at_k_advantages, obj.gdpo_advantages])
def test_a_key_passed_to_a_deterministic_estimator_says_it_takes_none(fn):
    x = rewards()[:, :, 0] if fn is obj.gdpo_advantages else rewards()[:, :, 0, 0]
    with pytest.raises(TypeError, match=rf"{fn.__name__}\(\) got a PRNG key .*takes no key"):
        fn(jax.random.key(0), x)


@pytest.mark.parametrize("name", obj.estimator_names())
def test_flat_rewards_name_to_groups(name):
    est = obj.get_estimator(name)
    x, smask = INPUTS[est.sees]()
    flat = jnp.reshape(x, (12,) + x.shape[2:])
    with pytest.raises(ValueError, match=r"has shape \(12,.*to_groups\(x, G\)"):
        est(jax.random.key(0), flat, smask)


def test_flat_policy_loss_inputs_name_to_groups():
    z_BGT, m_BGT = jnp.zeros((2, 4, 5)), jnp.ones((2, 4, 5), bool)
    for adv in (jnp.zeros((8,)), jnp.zeros((8, 5))):
        with pytest.raises(ValueError, match=r"expected adv_BG \(2, 4\) or adv_BGT \(2, 4, 5\).*"
                                             r"to_groups\(x, 4\)"):
            obj.policy_loss(z_BGT, z_BGT, adv, m_BGT)
    with pytest.raises(ValueError, match=r"shape \(3, 4\); expected adv_BG") as e:
        obj.policy_loss(z_BGT, z_BGT, jnp.zeros((3, 4)), m_BGT)
    assert "to_groups" not in str(e.value)  # not flat: no reshape suggested
    with pytest.raises(ValueError, match=r"logp_BGT has shape \(8, 5\).*to_groups\(x, G\)"):
        obj.policy_loss(z_BGT.reshape(8, 5), z_BGT.reshape(8, 5), jnp.zeros((8,)),
                        m_BGT.reshape(8, 5))
