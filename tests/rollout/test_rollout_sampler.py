"""Sampler: stop ids (one or several), a pad id that is a real token, determinism, greedy limit,
filters, prefix sharing, mesh invariance, decode phases (a growing cache) equal to the whole-cache
path, bf16 parameters on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo import prng as _prng
from vpo.config import ConfigError, SamplerConfig, model_preset
from vpo.model import sharding
from vpo.model.decoder import Decoder
from vpo.rollout.sampler import (
    _first_crossing,
    _first_crossing_blocked,
    _first_crossing_cumsum,
    _first_crossing_two_level,
    _inverse_cdf_draw,
    choose_tokens,
    decode_windows,
    generate_jit,
    left_pad,
)
from vpo.rollout.slots import sample, sample_with_keys

PAD, EOS = 0, 2
B, P, T, G = 8, 6, 12, 4
NEVER = 64  # the tiny preset's vocabulary is 0..63: a stop id the model never emits


@pytest.fixture(scope="module")
def model():
    return Decoder(model_preset("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def prompt_lists():
    rng = np.random.default_rng(0)
    return [list(rng.integers(4, 64, size=rng.integers(1, P + 1))) for _ in range(B)]


@pytest.fixture(scope="module")
def prompts(prompt_lists):
    return left_pad(prompt_lists, P, PAD)


def run(model, prompts, key=0, stop_ids=(EOS,), pad_id=PAD, **kw):
    cfg = SamplerConfig(**{"max_new_tokens": T, "num_samples": G, **kw})
    return sample(model, *prompts, jax.random.key(key), cfg, stop_ids=stop_ids, pad_id=pad_id)


def check_ends(r, ref, stops, pad_id):
    """`r` equals the unstopped `ref` up to and including each row's first token in `stops`
    (kept, masked True); after it every position is `pad_id`, masked False. Returns the token
    each row ended on (None: ran to the budget)."""
    toks, mask = np.asarray(r.tokens_BGT), np.asarray(r.mask_BGT)
    rtoks, rlogp = np.asarray(ref.tokens_BGT), np.asarray(ref.logp_BGT)
    assert np.asarray(ref.mask_BGT).all()  # the reference never stops
    ended = np.full((B, G), None, object)
    for b in range(B):
        for g in range(G):
            hits = np.flatnonzero(np.isin(rtoks[b, g], stops))
            end = hits[0] + 1 if len(hits) else T
            np.testing.assert_array_equal(toks[b, g, :end], rtoks[b, g, :end])
            np.testing.assert_allclose(np.asarray(r.logp_BGT)[b, g, :end], rlogp[b, g, :end],
                                       atol=1e-5)
            assert mask[b, g, :end].all() and not mask[b, g, end:].any()
            assert (toks[b, g, end:] == pad_id).all()
            assert r.length_BG[b, g] == end and bool(r.finished_BG[b, g]) == bool(len(hits))
            if len(hits):
                ended[b, g] = int(rtoks[b, g, hits[0]])
    return ended


def test_shapes_and_logp_consistency(model, prompts):
    r = run(model, prompts)
    assert r.tokens_BGT.shape == (B, G, T) and r.mask_BGT.dtype == bool
    # at temperature 1 without filters the sampling distribution is the model's
    np.testing.assert_allclose(r.sample_logp_BGT, r.logp_BGT, atol=1e-5)
    assert np.all(np.asarray(r.logp_BGT)[np.asarray(r.mask_BGT)] <= 0)
    assert np.all(np.asarray(r.entropy_BGT) >= 0)
    # logp of the sampled tokens equals a teacher-forced full forward over prompt + completion
    full = jnp.concatenate([prompts[0][:, None].repeat(G, 1), r.tokens_BGT], -1).reshape(B * G, -1)
    fmask = jnp.concatenate([jnp.asarray(prompts[1])[:, None].repeat(G, 1), r.mask_BGT], -1)
    logits = model(full, fmask.reshape(B * G, -1))[:, P - 1:-1]
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), r.tokens_BGT.reshape(B * G, T, 1), -1)
    m = np.asarray(r.mask_BGT).reshape(B * G, T)
    np.testing.assert_allclose(np.asarray(logp[..., 0])[m], np.asarray(r.logp_BGT).reshape(B * G,
                               T)[m], atol=1e-5)


def test_eos_stops_and_masks(model, prompts):
    greedy = run(model, prompts, temperature=0.0)
    eos = int(greedy.tokens_BGT[0, 0, 3])  # make the 4th greedy token of row 0 the EOS
    r = run(model, prompts, temperature=0.0, stop_ids=(eos,))
    toks, mask = np.asarray(r.tokens_BGT), np.asarray(r.mask_BGT)
    first = np.argmax(toks[0, 0] == eos)
    assert first <= 3 and r.finished_BG[0, 0]
    assert mask[0, 0, : first + 1].all() and not mask[0, 0, first + 1:].any()
    assert (toks[0, 0, first + 1:] == PAD).all()
    for b in range(B):
        for g in range(G):
            hits = np.flatnonzero(toks[b, g] == eos)
            end = hits[0] + 1 if len(hits) else T
            assert mask[b, g].sum() == end == r.length_BG[b, g]
            assert bool(r.finished_BG[b, g]) == bool(len(hits))


def test_stops_on_any_of_several_stop_ids(model, prompts):
    """stop_ids=(a, b): a row ends at its first a OR b (kept, masked True), pad after it."""
    ref = run(model, prompts, 11, stop_ids=(NEVER,))
    rtoks = np.asarray(ref.tokens_BGT)
    a = int(rtoks[0, 0, 3])
    # b: a token some row emits before any a, and row (0, 0) does not emit before its a
    b = next(int(rtoks[i, g, t]) for i in range(1, B) for g in range(G) for t in range(T)
             if rtoks[i, g, t] != a and a not in rtoks[i, g, :t + 1]
             and rtoks[i, g, t] not in rtoks[0, 0, :4])
    r = run(model, prompts, 11, stop_ids=(a, b))
    ended = check_ends(r, ref, [a, b], PAD)
    assert ended[0, 0] == a and (ended == b).any()  # rows stop on either id
    # the order of the stop ids does not matter; a single stop id stops fewer rows
    np.testing.assert_array_equal(run(model, prompts, 11, stop_ids=(b, a)).tokens_BGT,
                                  r.tokens_BGT)
    # with a alone, the rows that stopped on b go on
    only_a = run(model, prompts, 11, stop_ids=(a,))
    assert not (check_ends(only_a, ref, [a], PAD) == b).any()
    on_b = ended == b
    assert (np.asarray(only_a.length_BG)[on_b] > np.asarray(r.length_BG)[on_b]).all()


def test_pad_id_that_is_a_real_token(model, prompt_lists, prompts):
    """The pad id may be an ordinary token (byte-level BPE has no reserved pad): prompts padded
    with it sample exactly as prompts padded with another id (masks, not token values, say what
    is real); a generated pad-valued token is kept, masked True, and the row goes on."""
    ref = run(model, prompts, 12, stop_ids=(NEVER,))
    rtoks = np.asarray(ref.tokens_BGT)
    x = int(rtoks[0, 0, 1])  # a token the model generates: now the pad id
    s = next(int(t) for t in rtoks[0, 0, 2:] if t != x and t not in rtoks[0, 0, :2])  # stop
    padded = left_pad(prompt_lists, P, x)
    assert (padded[0][~padded[1]] == x).all() and (~padded[1]).any()
    r = run(model, padded, 12, stop_ids=(s,), pad_id=x)
    ended = check_ends(r, ref, [s], x)
    toks, mask = np.asarray(r.tokens_BGT), np.asarray(r.mask_BGT)
    assert ended[0, 0] == s and toks[0, 0, 1] == x and mask[0, 0, 1]
    assert r.length_BG[0, 0] > 2  # it went on after generating the pad id
    assert (mask & (toks == x)).any() and (~mask & (toks == x)).any()  # both kinds of x


def test_same_key_same_output_other_key_differs(model, prompts):
    a, b, c = run(model, prompts, 1), run(model, prompts, 1), run(model, prompts, 2)
    np.testing.assert_array_equal(a.tokens_BGT, b.tokens_BGT)
    assert not np.array_equal(a.tokens_BGT, c.tokens_BGT)
    # samples of one prompt differ from each other
    assert len({tuple(x) for x in np.asarray(a.tokens_BGT[0])}) > 1


def test_low_temperature_matches_greedy(model, prompts):
    greedy = run(model, prompts, temperature=0.0)
    cold = run(model, prompts, temperature=1e-4)
    np.testing.assert_array_equal(greedy.tokens_BGT, cold.tokens_BGT)
    # greedy samples of one prompt are identical
    assert (greedy.tokens_BGT == greedy.tokens_BGT[:, :1]).all()


@pytest.mark.parametrize("top_k, top_p, allowed", [
    (2, 1.0, {0, 1}), (3, 1.0, {0, 1, 2}), (0, 0.7, {0, 1}), (0, 0.85, {0, 1, 2}),
    (2, 0.5, {0}), (1, 1.0, {0}),
])
def test_filters_never_leave_allowed_set(top_k, top_p, allowed):
    probs = jnp.array([0.5, 0.3, 0.1, 0.06, 0.04])
    n = 4096
    logits = jnp.broadcast_to(jnp.log(probs), (1, n, 5))
    u = jax.random.uniform(jax.random.key(0), (1, n))
    tok, _, slogp, _ = jax.jit(choose_tokens)(logits, u, 1.0, top_p, top_k)
    seen = set(np.unique(np.asarray(tok)).tolist())
    assert seen == allowed
    renorm = probs[jnp.array(sorted(allowed))].sum()
    np.testing.assert_allclose(np.exp(slogp[0, 0]), probs[tok[0, 0]] / renorm, rtol=1e-5)


def test_inverse_cdf_draw_follows_the_distribution():
    """Token frequencies of the one-uniform-per-row draw match softmax(logits) (and a zero-mass
    token is never drawn, even at u -> 1)."""
    probs = np.array([0.5, 0.3, 0.1, 0.06, 0.04, 0.0])
    n = 20000
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(probs)), (1, n, 6))
    u = _prng.uniform(jax.random.key(3), (1, n)).at[0, 0].set(1.0 - 2**-24)
    tok = np.asarray(jax.jit(choose_tokens)(logits, u, 1.0, 1.0, 0)[0])
    freq = np.bincount(tok.ravel(), minlength=6) / n
    np.testing.assert_allclose(freq, probs, atol=4 * np.sqrt(0.25 / n))
    assert freq[5] == 0 and tok[0, 0] == 4


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's cumsum rounding")
@pytest.mark.parametrize("V", [1, 5, 16, 17, 64, 201, 256])
def test_blocked_first_crossing_equals_the_cumsum_search(V):
    """The CPU search without the [.., V] cumulative sums returns the very token of the
    `jnp.cumsum` definition, rounding included: masses over many magnitudes, zeros (filtered
    tokens), and thresholds at, just below and past the cumulative sums (the rounding edges,
    where a different summation order would pick a neighbour)."""
    rng = np.random.default_rng(V)
    R = 256
    q = (rng.random((R, V)) * np.exp(rng.normal(size=(R, V)) * rng.choice([0, 1, 6], (R, 1))))
    q = np.where(rng.random((R, V)) < rng.choice([0.0, 0.5, 0.95], (R, 1)), 0.0, q)
    q = q.astype(np.float32)
    cum = np.asarray(jnp.cumsum(jnp.asarray(q), axis=-1))
    at = cum[np.arange(R), rng.integers(0, V, R)]
    thr = np.stack([rng.random(R).astype(np.float32) * q.sum(-1), at,
                    np.nextafter(at, np.float32(-np.inf)), cum[:, -1],
                    np.nextafter(cum[:, -1], np.float32(np.inf))]).astype(np.float32)
    q_b = jnp.broadcast_to(jnp.asarray(q), (5, R, V))
    ref = np.asarray(jax.jit(_first_crossing_cumsum)(q_b, jnp.asarray(thr)))
    np.testing.assert_array_equal(
        np.asarray(jax.jit(_first_crossing_blocked)(q_b, jnp.asarray(thr))), ref)
    np.testing.assert_array_equal(np.asarray(jax.jit(_first_crossing)(q_b, jnp.asarray(thr))),
                                  ref)
    has_mass = (q > 0).any(-1)
    assert (q[np.arange(R), ref] > 0)[:, has_mass].all()  # a zero-mass token is never drawn


@pytest.mark.parametrize("V", [257, 1000, 4096, 49152])
def test_two_level_first_crossing_is_the_cumsum_search_up_to_rounding(V):
    """The CPU search for long vocabularies: on random thresholds the definition's token in
    nearly every row and otherwise a token within float32 rounding of the threshold (checked
    against float64 sums); never a zero-mass token, also at thresholds on the tile ends (where
    the tile's own sums may fall short by rounding) and past the total; V - 1 for a row
    without mass."""
    rng = np.random.default_rng(V)
    R = 128
    q = (rng.random((R, V)) * np.exp(rng.normal(size=(R, V)) * rng.choice([0, 1, 6], (R, 1))))
    q = np.where(rng.random((R, V)) < rng.choice([0.0, 0.5, 0.95], (R, 1)), 0.0, q)
    q[0] = 0.0  # no mass at all
    q = q.astype(np.float32)
    total = q.sum(-1, dtype=np.float64)
    K = 256
    nt = -(-V // K)
    tile_ends = np.cumsum(np.pad(q, [(0, 0), (0, nt * K - V)]).reshape(R, nt, K).sum(-1), -1)
    edge = tile_ends[np.arange(R), rng.integers(0, nt, R)].astype(np.float32)
    rand = (rng.random(R) * total).astype(np.float32)
    thr = np.stack([rand, edge, np.nextafter(edge, np.float32(-np.inf)),
                    (total * (1 + 1e-4)).astype(np.float32)])
    got = np.asarray(jax.jit(_first_crossing_two_level)(jnp.broadcast_to(q, (4, R, V)), thr))
    ref = np.asarray(jax.jit(_first_crossing_cumsum)(jnp.broadcast_to(q, (4, R, V)), thr))
    assert got[0, 0] == V - 1 and (got[:, 0] == V - 1).all()
    mass = np.arange(R) > 0
    assert (q[np.arange(R)[None, :], got] > 0)[:, mass].all()  # never a zero-mass token
    assert (got[3] == ref[3]).all()  # past the total: the last token with mass
    assert (got[0] == ref[0]).mean() >= 0.97
    cum64 = np.cumsum(q.astype(np.float64), -1)
    tol = 1e-5 * total
    for row in np.nonzero(mass)[0]:
        t, th = got[0, row], float(thr[0, row])
        assert cum64[row, t] > th - tol[row]
        assert t == 0 or cum64[row, t - 1] <= th + tol[row]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU search")
def test_long_vocabulary_draws_follow_the_distribution():
    """Token frequencies of `choose_tokens` at V = 1024 (the two-level search over 4 tiles)
    match softmax(logits) on the tokens holding the mass."""
    V, n = 1024, 20000
    probs = np.zeros(V)
    probs[[3, 255, 256, 700, 1023]] = [0.4, 0.25, 0.15, 0.15, 0.05]
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32)), (1, n, V))
    u = _prng.uniform(jax.random.key(5), (1, n))
    tok = np.asarray(jax.jit(choose_tokens)(logits, u, 1.0, 1.0, 0)[0])
    freq = np.bincount(tok.ravel(), minlength=V) / n
    np.testing.assert_allclose(freq, probs, atol=4 * np.sqrt(0.25 / n))


def test_unrolled_threefry_matches_jax():
    from jax.extend.random import threefry_2x32
    kd = jax.random.key_data(jax.random.key(7))
    c = jnp.arange(257, dtype=jnp.uint32)
    ref = threefry_2x32(kd, jnp.concatenate([jnp.zeros_like(c), c]))
    ours = jnp.concatenate(_prng.threefry2x32(kd[0], kd[1], jnp.zeros_like(c), c))
    np.testing.assert_array_equal(ours, ref)
    u = np.asarray(_prng.uniform(jax.random.key(1), (3, 1001)))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    assert len(np.unique(u)) > 2990  # both hash words used, no repeats


def test_prefix_sharing_equals_separate_runs(model, prompts):
    """G samples sharing one prefill equal B*G separate prompts sampled with the same keys."""
    cfg = SamplerConfig(max_new_tokens=T, num_samples=G)
    keys = jax.random.split(jax.random.key(5), B * G).reshape(B, G)
    shared = sample_with_keys(model, *prompts, keys, cfg, stop_ids=(EOS,), pad_id=PAD)
    rep = lambda x: np.repeat(np.asarray(x), G, axis=0)  # noqa: E731
    alone = sample_with_keys(model, rep(prompts[0]), rep(prompts[1]), keys.reshape(B * G, 1),
                             cfg, stop_ids=(EOS,), pad_id=PAD)
    np.testing.assert_array_equal(shared.tokens_BGT.reshape(B * G, T), alone.tokens_BGT[:, 0])
    np.testing.assert_allclose(shared.logp_BGT.reshape(B * G, T), alone.logp_BGT[:, 0],
                               atol=1e-5)


def test_mesh_matches_single_device(model, prompts):
    single = run(model, prompts, 3)
    mesh = sharding.make_mesh(data=8)
    sharded_model = sharding.shard_model(nnx.clone(model), mesh)
    tokens = jax.device_put(prompts[0], sharding.batch_sharding(mesh, 2))
    mask = jax.device_put(prompts[1], sharding.batch_sharding(mesh, 2))
    multi = run(sharded_model, (tokens, mask), 3)
    assert len(multi.tokens_BGT.sharding.device_set) == 8
    np.testing.assert_array_equal(single.tokens_BGT, multi.tokens_BGT)
    np.testing.assert_allclose(single.logp_BGT, multi.logp_BGT, atol=1e-5)


def test_tensor_parallel_mesh_matches(model, prompts):
    single = run(model, prompts, 4)
    mesh = sharding.make_mesh(data=4, tensor=2)
    m = sharding.shard_model(nnx.clone(model), mesh)
    assert m.layers[0].attn.wq[...].sharding.spec == jax.P(None, "tensor", None)
    multi = run(m, (jax.device_put(prompts[0], sharding.batch_sharding(mesh, 2)),
                    jax.device_put(prompts[1], sharding.batch_sharding(mesh, 2))), 4)
    np.testing.assert_array_equal(single.tokens_BGT, multi.tokens_BGT)


def test_decode_windows():
    assert decode_windows(12, 4) == (4, 8, 12)
    assert decode_windows(16, 4) == (4, 8, 16)
    assert decode_windows(1024) == (64, 128, 256, 512, 1024)
    assert decode_windows(64) == (64,) and decode_windows(12) == (12,)
    with pytest.raises(ValueError, match="decode block"):
        decode_windows(8, 0)


def phased(model, prompts, keys, decode_block, temperature=1.0):
    graphdef, state = nnx.split(model)
    return generate_jit(graphdef, state, prompts[0], prompts[1], keys, jnp.float32(temperature),
                         jnp.float32(1.0), jnp.int32(0), max_new_tokens=T, stop_ids=(EOS,),
                         pad_id=PAD, decode_block=decode_block)


def test_phased_decode_equals_whole_cache(model, prompts):
    """Decoding with the cache grown in phases (8, then 12 slots) gives the tokens, log-probs and
    entropies of the whole 12-slot cache at every step (`run`: T is below the first phase's
    length), on one device and on a mesh."""
    keys = jax.random.split(jax.random.key(6), B * G).reshape(B, G)
    whole = run(model, prompts, 6)
    grown = phased(model, prompts, keys, 8)
    assert not np.asarray(whole.finished_BG).all()  # rows run into the later phases
    np.testing.assert_array_equal(grown.tokens_BGT, whole.tokens_BGT)
    np.testing.assert_array_equal(grown.mask_BGT, whole.mask_BGT)
    for name in ("logp_BGT", "sample_logp_BGT", "entropy_BGT"):
        np.testing.assert_allclose(getattr(grown, name), getattr(whole, name), atol=1e-5)
    mesh = sharding.make_mesh(data=4, tensor=2)
    m = sharding.shard_model(nnx.clone(model), mesh)
    on_mesh = phased(m, tuple(jax.device_put(x, sharding.batch_sharding(mesh, 2))
                              for x in prompts), keys, 8)
    assert len(on_mesh.tokens_BGT.sharding.device_set) == 8
    np.testing.assert_array_equal(on_mesh.tokens_BGT, whole.tokens_BGT)
    np.testing.assert_allclose(on_mesh.logp_BGT, whole.logp_BGT, atol=1e-5)


def test_bfloat16_model_samples_on_cpu(prompts):
    """bf16 parameters and compute on CPU: sampling runs (no bf16 x bf16 -> f32 dot) and gives
    valid tokens with finite log-probs."""
    m = Decoder(model_preset("tiny", dtype="bfloat16", param_dtype="bfloat16"),
                rngs=nnx.Rngs(0))
    r = run(m, prompts, 7)
    assert r.tokens_BGT.shape == (B, G, T)
    toks, mask = np.asarray(r.tokens_BGT), np.asarray(r.mask_BGT)
    assert ((toks >= 0) & (toks < 64)).all()
    assert np.isfinite(np.asarray(r.logp_BGT)).all() and (np.asarray(r.logp_BGT)[mask] <= 0).all()


def test_budget_errors(model):
    with pytest.raises(ConfigError, match="sampler.max_new_tokens"):
        sample(model, np.ones((1, 500), np.int32), np.ones((1, 500), bool), jax.random.key(0),
               SamplerConfig(max_new_tokens=64), stop_ids=(EOS,), pad_id=PAD)
    with pytest.raises(ValueError, match="prompt 1 has 9 tokens"):
        left_pad([[1], list(range(9))], 8, PAD)
    toks, mask = left_pad([[1], list(range(9))], 8, PAD, truncate=True)
    assert toks[1].tolist() == list(range(1, 9)) and mask.all(axis=1).tolist() == [False, True]
    with pytest.raises(ConfigError, match="sampler.top_p"):
        SamplerConfig(top_p=0.0)


@pytest.mark.parametrize("V", [201, 4096])
def test_plain_draw_reuses_the_softmax_pass_exactly(V):
    """At temperature 1 without a filter `choose_tokens` draws from the exp pass it shares with
    the log-normaliser: the same tokens as the inverse-CDF draw on the logits, its sampling
    log-prob equal to the log-prob, the entropy -Σ p log p of softmax(logits)."""
    logits = 3.0 * jax.random.normal(jax.random.key(V), (16, 8, V))
    u = jax.random.uniform(jax.random.key(1), (16, 8))
    tok, logp, slogp, ent = jax.jit(choose_tokens)(logits, u, 1.0, 1.0, 0)
    ref_tok, ref_norm = jax.jit(_inverse_cdf_draw)(u, logits)
    np.testing.assert_array_equal(tok, ref_tok)
    np.testing.assert_array_equal(slogp, logp)
    logp_ref = jnp.take_along_axis(logits, tok[..., None], -1)[..., 0] - ref_norm
    np.testing.assert_allclose(logp, logp_ref, atol=1e-6)
    p = jax.nn.softmax(logits, -1)
    np.testing.assert_allclose(ent, -jnp.sum(p * jax.nn.log_softmax(logits, -1), -1), atol=1e-5)
    # another temperature takes the general branch: still a valid draw, sample_logp differs
    tok7, logp7, slogp7, _ = jax.jit(choose_tokens)(logits, u, 0.7, 1.0, 0)
    assert not np.allclose(slogp7, logp7)
