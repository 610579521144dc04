"""Refilled slots (`vpo.rollout.slots`): the same keys give the same rollouts as the all-rows
sampler for any number of slots, stop set, sampling filter and layer layout; `extend_rows` is
`extend` row by row; the dispatcher and `sampler.num_slots` validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo.config import ConfigError, SamplerConfig, SearchConfig, model_preset
from vpo.model.decoder import Decoder, KVCache, Prefix
from vpo.rollout import slots as slots_lib
from vpo.rollout.sampler import SamplerModelError, generate_jit, left_pad
from vpo.rollout.slots import (
    generate_rollouts,
    generate_slots,
    generate_slots_jit,
    sample_with_keys,
    uses_slots,
)

PAD = 0
B, P, T, G = 4, 6, 10, 3
R = B * G
MANY_STOPS = tuple(range(2, 14))  # completions of 1 to T tokens on the tiny random model


@pytest.fixture(scope="module")
def model():
    return Decoder(model_preset("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(1)
    rows = [list(rng.integers(4, 64, size=rng.integers(1, P + 1))) for _ in range(B)]
    p, m = left_pad(rows, P, PAD)
    return jnp.asarray(p), jnp.asarray(m)


@pytest.fixture(scope="module")
def keys():
    return jax.random.split(jax.random.key(3), R).reshape(B, G)


def both(model, prompts, keys, num_slots, stop_ids=MANY_STOPS, temperature=1.0, top_p=1.0,
         top_k=0):
    graphdef, state = nnx.split(model)
    args = (graphdef, state, *prompts, keys, jnp.float32(temperature), jnp.float32(top_p),
            jnp.int32(top_k))
    kw = dict(max_new_tokens=T, stop_ids=stop_ids, pad_id=PAD)
    return generate_jit(*args, **kw), generate_slots_jit(*args, num_slots=num_slots, **kw)


def assert_same(ref, got):
    for name in ("tokens_BGT", "mask_BGT", "length_BG", "finished_BG"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)),
                                      np.asarray(getattr(ref, name)), err_msg=name)
    for name in ("logp_BGT", "sample_logp_BGT", "entropy_BGT"):
        np.testing.assert_allclose(np.asarray(getattr(got, name)),
                                   np.asarray(getattr(ref, name)), atol=1e-5, err_msg=name)


@pytest.mark.parametrize("num_slots", [1, 5, R - 1])
def test_slots_give_the_rollouts_of_generate(model, prompts, keys, num_slots):
    ref, got = both(model, prompts, keys, num_slots)
    lengths = np.asarray(ref.length_BG)
    assert lengths.min() < T // 2 and lengths.max() == T  # a spread: short ones and the budget
    assert_same(ref, got)


def test_one_stop_id_most_rows_run_to_the_budget(model, prompts, keys):
    ref, got = both(model, prompts, keys, 4, stop_ids=(2,))
    assert_same(ref, got)


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.0, 1.0, 0), (0.7, 0.9, 8)])
def test_greedy_and_filtered_draws(model, prompts, keys, temperature, top_p, top_k):
    ref, got = both(model, prompts, keys, 5, temperature=temperature, top_p=top_p, top_k=top_k)
    assert_same(ref, got)


def test_scanned_layers(prompts, keys):
    model = Decoder(model_preset("tiny", scan_layers=True), rngs=nnx.Rngs(0))
    ref, got = both(model, prompts, keys, 5)
    assert_same(ref, got)


def test_extend_rows_is_extend_per_row(model, prompts):
    """Rows at different positions: each equals `extend` of that row alone at its slot."""
    _, prefix = model.prefill(*prompts)
    C = 8
    rng = np.random.default_rng(0)
    shape = (B, 1, model.cfg.num_kv_heads, C, model.cfg.head_dim)
    cache = KVCache(*(tuple(jnp.asarray(rng.normal(size=shape), jnp.float32)
                            for _ in range(model.cfg.num_layers)) for _ in range(2)))
    tokens_N = jnp.asarray([5, 9, 17, 33], jnp.int32)
    start_N = jnp.asarray([0, 3, 7, 2], jnp.int32)
    h_ND, rows = model.extend_rows(tokens_N, prefix, cache, start_N)
    for r in range(B):
        one = Prefix(tuple(k[r:r + 1] for k in prefix.k_BZPE),
                     tuple(v[r:r + 1] for v in prefix.v_BZPE),
                     prefix.mask_BP[r:r + 1], prefix.length_B[r:r + 1])
        c = KVCache(tuple(k[r:r + 1] for k in cache.k_BGZCE),
                    tuple(v[r:r + 1] for v in cache.v_BGZCE))
        h, c = model.extend(tokens_N[r].reshape(1, 1, 1), one, c, int(start_N[r]))
        np.testing.assert_allclose(np.asarray(h_ND[r]), np.asarray(h[0, 0, 0]), atol=1e-5)
        for i in range(model.cfg.num_layers):
            np.testing.assert_allclose(np.asarray(rows.k_BGZCE[i][r]),
                                       np.asarray(c.k_BGZCE[i][0]), atol=1e-6)


def test_dispatch(model, prompts, keys):
    assert not uses_slots(0, R) and uses_slots(1, R) and uses_slots(R - 1, R)
    assert not uses_slots(R, R) and not uses_slots(R + 5, R)
    cfg = SamplerConfig(max_new_tokens=T, num_samples=G)
    kw = dict(stop_ids=MANY_STOPS, pad_id=PAD)
    ref = sample_with_keys(model, *prompts, keys, cfg, **kw)
    got = sample_with_keys(model, *prompts, keys, SamplerConfig(
        max_new_tokens=T, num_samples=G, num_slots=5), **kw)
    assert_same(ref, got)
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda s, k: generate_rollouts(
        nnx.merge(graphdef, s), *prompts, k, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0),
        max_new_tokens=T, num_slots=R, **kw))  # S = R: every rollout its own row
    assert_same(ref, run(state, keys))


def test_num_slots_0_takes_slots_only_where_the_rows_caches_do_not_fit(model, prompts, keys,
                                                                        monkeypatch):
    """`slots_for`: a set S stands; 0 keeps R rows while their caches fit a quarter of the
    devices' memory (unknown on XLA:CPU: R rows), else the most rows that fit, a multiple of 8;
    the sampler then gives the rollouts of the all-rows one."""
    cfg = model.cfg
    row = slots_lib.cache_bytes_per_row(cfg, P + T)
    assert row == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (P + T) * 4
    assert slots_lib.device_memory() is None  # XLA:CPU does not say
    assert slots_lib.slots_for(0, cfg, P + T, R) == 0
    assert slots_lib.slots_for(0, cfg, P + T, R, memory_bytes=4 * row * R) == 0
    assert slots_lib.slots_for(0, cfg, P + T, 64, memory_bytes=4 * row * 20) == 16
    assert slots_lib.slots_for(0, cfg, P + T, 64, memory_bytes=4 * row * 3) == 8
    assert slots_lib.slots_for(0, cfg, P + T, R, memory_bytes=4 * row * 11) == 8
    assert slots_lib.slots_for(5, cfg, P + T, R, memory_bytes=1) == 5  # set by the user
    kw = dict(stop_ids=MANY_STOPS, pad_id=PAD)
    ref = sample_with_keys(model, *prompts, keys, SamplerConfig(max_new_tokens=T, num_samples=G),
                           **kw)
    used = []
    real = slots_lib.generate_slots_jit
    monkeypatch.setattr(slots_lib, "device_memory", lambda: 4 * row * 9)
    monkeypatch.setattr(slots_lib, "generate_slots_jit",
                        lambda *a, **k: used.append(k["num_slots"]) or real(*a, **k))
    assert_same(ref, sample_with_keys(model, *prompts, keys,
                                      SamplerConfig(max_new_tokens=T, num_samples=G), **kw))
    assert used == [8]


def test_num_slots_is_validated():
    with pytest.raises(ConfigError, match="sampler.num_slots"):
        SamplerConfig(num_slots=-1)
    with pytest.raises(ConfigError, match="search.num_slots"):
        SearchConfig(num_slots=-2)
    assert SamplerConfig().num_slots == 0


def test_a_model_without_extend_rows_is_named(model, prompts, keys):
    class NoRows:
        def __init__(self, m):
            self.m = m

        def __getattr__(self, name):
            if name == "extend_rows":
                raise AttributeError(name)
            return getattr(self.m, name)

    with pytest.raises(SamplerModelError, match="extend_rows"):
        generate_slots(NoRows(model), *prompts, keys, 1.0, 1.0, 0, max_new_tokens=T,
                       stop_ids=(2,), pad_id=PAD, num_slots=2)
    with pytest.raises(ValueError, match="num_slots"):
        generate_slots(model, *prompts, keys, 1.0, 1.0, 0, max_new_tokens=T, stop_ids=(2,),
                       pad_id=PAD, num_slots=0)


@pytest.mark.parametrize("devices", [1, 8])
def test_the_sampler_program_builds_with_slots(devices):
    """`vpo plan`'s sampler program (`vpo.accel.build`) with sampler.num_slots, compiled ahead
    of time for this host's CPU devices (one, and the 8-device data mesh); the TPU / H100
    builds are tests/accel/test_accel.py's (they need the AOT interpreter)."""
    from vpo.accel import build as build_lib
    from vpo.launch.assemble import assemble_run
    from vpo.model import sharding

    a = assemble_run("smoke", None, ["model=tiny", "train.batch_size=8", "sampler.num_slots=4"])
    assert 0 < a.run.sampler.num_slots < a.run.train.batch_size * a.run.sampler.num_samples
    mesh = sharding.make_mesh(devices=jax.devices()[:devices])
    (built,) = build_lib.build("sampler", a.run, a.task, mesh)
    assert built.error is None, built.error


def test_the_rl_step_samples_the_same_rollouts_through_slots():
    """`vpo.rl.step.sample_rollout` with sampler.num_slots gives the rollouts of all rows."""
    import dataclasses
    import functools

    from vpo.launch.assemble import assemble_run
    from vpo.model import sharding
    from vpo.rl import step as step_lib
    from vpo.run import data as data_lib
    from vpo.run import loop as loop_lib

    a = assemble_run("smoke", None, ["model=tiny", "train.batch_size=4"])
    run, task = a.run, a.task
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    graphdef, state, _ = step_lib.init_state(run.model, step_lib.make_optimizer(run.train),
                                             mesh, seed=0)
    batch = loop_lib.shard_batch(next(data_lib.problem_iterator(
        task, 4, run.train.num_answers, num_problems=16)), mesh)

    def sample(num_slots):
        r = dataclasses.replace(run, sampler=dataclasses.replace(run.sampler,
                                                                 num_slots=num_slots))
        cfg = step_lib.step_config(r, task)
        return jax.jit(functools.partial(step_lib.sample_rollout, graphdef=graphdef,
                                         cfg=cfg))(state, batch)

    assert_same(sample(0), sample(3))


def test_plan_states_the_sampler_rows():
    from vpo.accel.program_report import decode_rows

    assert decode_rows(8, 32) == "S=8 slots (sampler.num_slots) for the 32 rollouts"
    assert decode_rows(0, 32) == decode_rows(32, 32) == "all 32 rows (sampler.num_slots=0)"
