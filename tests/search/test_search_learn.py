"""The island search that learns (`vpo.search.learn`, its step `vpo.rl.search_update`): at
learning rate 0 it is the frozen search bit for bit (populations, trace, budget); the next
generation samples from the parameters in the carry; the update moves the parameters along
the advantages; the entropic advantage against its formula; named errors for what cannot
learn."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from vpo import objectives
from vpo.config import ConfigError, LearnConfig, model_preset
from vpo.model import lora as lora_lib
from vpo.model.decoder import Decoder
from vpo.rl import search_update as update_lib
from vpo.search import ingraph
from vpo.search import learn as learn_search
from vpo.tasks import make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer
from vpo.types import SearchCalls

CFG = ingraph.SearchConfig(islands=2, members=2, parents=1, children=4, generations=2,
                           migration_interval=1, num_answers=2)
LEARN = LearnConfig(objective="grpo", learning_rate=1e-2, lora_rank=2)


@pytest.fixture(scope="module")
def setup():
    text_task = make_task("program", difficulty="easy")
    task = bind(text_task, task_word_tokenizer(text_task))
    records = task.make_problems(0, 2)
    problems = ingraph.search_problems(task, records, CFG.num_answers)
    need = seq_len_for(task, records, CFG.num_answers, num_parents=CFG.parents)
    model = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need),
                    rngs=nnx.Rngs(0))
    return task, problems, model


@pytest.fixture(scope="module")
def frozen_and_rate_zero(setup):
    task, problems, model = setup
    key = jax.random.key(0)
    frozen = ingraph.run_method(key, "search", learn_search.trainable_model(model, LEARN), task,
                                problems, CFG)
    zero = learn_search.learning_run(key, model, task, problems, CFG, LEARN,
                                     update_lib.make_learner, learning_rate=0.0)
    return frozen, zero


@pytest.mark.slow  # ~70 s cold on 2 CPU cores: two compiled searches (the slow set)
def test_rate_zero_is_the_frozen_search(frozen_and_rate_zero):
    frozen, zero = frozen_and_rate_zero
    for a, b in zip(jax.tree.leaves(zero.trace), jax.tree.leaves(frozen.trace), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(zero.state.search.population),
                    jax.tree.leaves(frozen.state.population), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(zero.state.search.best_fitness, frozen.state.best_fitness)
    assert int(zero.state.updates) == CFG.generations  # updates ran (of size 0)


@pytest.mark.slow  # shares the searches above
def test_budget_counts_every_candidate_as_the_frozen_search(frozen_and_rate_zero):
    frozen, zero = frozen_and_rate_zero
    want = [CFG.islands * (CFG.members + g * CFG.children) for g in range(CFG.generations + 1)]
    assert np.asarray(zero.trace.evaluated).tolist() == [want] * 2
    assert np.asarray(zero.state.search.evaluated).tolist() == [CFG.budget] * 2
    assert np.asarray(frozen.trace.evaluated).tolist() == [want] * 2
    last = zero.state.last  # [N·I groups, C / m calls, ...]: one row per policy call
    assert last.tokens_BGT.shape[:2] == (2 * CFG.islands, CFG.children // CFG.num_answers)
    assert last.valid_BGM.shape[-1] == CFG.num_answers
    assert set(zero.metrics) >= {"loss", "grad_norm", "skipped", "mismatch_max_abs_logp",
                                 "entropy"}
    assert all(np.asarray(v).shape == (CFG.generations,) for v in zero.metrics.values())


@pytest.mark.slow  # ~40 s cold: one more compiled learning search
def test_every_k_updates_after_every_kth_generation_only(setup, frozen_and_rate_zero):
    """learn.every = 2 over 2 generations: no update after generation 1 (NaN metrics,
    `updated` 0), one after generation 2 (Adam's step count 1); both generations sample from
    the starting parameters, so the trace is the frozen search's bit for bit at a positive
    rate."""
    task, problems, model = setup
    frozen, _ = frozen_and_rate_zero
    learn = LearnConfig(objective="grpo", learning_rate=1e-2, lora_rank=2, every=2)
    out = learn_search.learning_run(jax.random.key(0), model, task, problems, CFG, learn,
                                    update_lib.make_learner)
    for a, b in zip(jax.tree.leaves(out.trace), jax.tree.leaves(frozen.trace), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(out.metrics["updated"]).tolist() == [0, 1]
    assert int(out.state.updates) == 1
    loss = np.asarray(out.metrics["loss"])
    assert np.isnan(loss[0]) and np.isfinite(loss[1])
    assert np.asarray(out.metrics["skipped"]).tolist() == [0, 0]
    adam = [s for s in jax.tree.leaves(out.state.opt_state,
                                       is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)]
    assert [int(s.count) for s in adam] == [1]


@pytest.mark.slow  # ~36 s cold: init, step and the log-prob pass compiled
def test_next_generation_samples_from_the_parameters_in_the_carry(setup):
    """A step samples with state.params: after the parameters change (as an update changes
    them), the next generation's recorded log-probs are the new parameters' (recomputed by the
    update's own pass), not the old ones'."""
    task, problems, model = setup
    graphdef, params, frozen = lora_lib.split(learn_search.trainable_model(model, LEARN))
    init, step = learn_search.make_learning_search(task, CFG, graphdef, LEARN,
                                                     update_lib.make_learner)
    keys_N = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(1), i))(jnp.arange(2))
    state = jax.jit(init)(keys_N, jax.tree.map(jnp.asarray, problems), params, frozen)
    moved = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(jax.random.key(2), x.shape,
                                                               x.dtype), state.params)
    after = jax.jit(step)(jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_N, 1),
                          state._replace(params=moved))
    gen = after.last
    logp = jax.jit(update_lib.logp_fn(graphdef, frozen))
    real = np.asarray(gen.mask_BGT)
    assert real.any()
    np.testing.assert_allclose(np.asarray(gen.logp_BGT)[real],
                               np.asarray(logp(moved, gen)[0])[real], atol=2e-5)
    assert np.abs(np.asarray(gen.logp_BGT) - np.asarray(logp(params, gen)[0]))[real].max() > 1e-2
    assert np.asarray(after.search.evaluated).tolist() == [
        CFG.islands * (CFG.members + CFG.children)] * 2


def _toy_generation(rewards_BGM, valid_BGM=None):
    """B groups of G one-token completions: call g writes token g (logp = a table lookup)."""
    rewards_BGM = jnp.asarray(rewards_BGM, jnp.float32)
    B, G, M = rewards_BGM.shape
    tokens_BGT = jnp.broadcast_to(jnp.arange(G)[None, :, None], (B, G, 1)).astype(jnp.int32)
    valid = jnp.ones((B, G, M), bool) if valid_BGM is None else jnp.asarray(valid_BGM)
    return SearchCalls(
        jnp.zeros((B, G, 1), jnp.int32), jnp.ones((B, G, 1), bool), tokens_BGT,
        jnp.ones((B, G, 1), bool), jnp.zeros((B, G, 1), jnp.float32),
        rewards_BGM[..., None], valid)


def _toy_logp(params, gen):
    logp_V = jax.nn.log_softmax(params["logits_V"])
    entropy = -jnp.sum(jnp.exp(logp_V) * logp_V)
    return logp_V[gen.tokens_BGT], jnp.full(gen.tokens_BGT.shape, entropy)


@pytest.mark.parametrize("objective", ["grpo", "vpo", "entropic"])
def test_an_update_moves_probability_towards_the_better_calls(objective):
    learn = LearnConfig(objective=objective, learning_rate=0.1, num_weights=16)
    gen = _toy_generation([[[1.0, 0.8], [0.0, 0.0], [0.2, 0.1]]])  # call 0 best, call 1 worst
    params = {"logits_V": jnp.zeros((3,), jnp.float32)}
    tx = update_lib.make_optimizer(learn)
    new, _, metrics = update_lib.learn_update(
        params, tx.init(params), jnp.float32(learn.learning_rate), gen, jax.random.key(0),
        logp=_toy_logp, ref_logp=None, tx=tx, learn=learn, weights_R=np.ones(1))
    probs = np.asarray(jax.nn.softmax(new["logits_V"]))
    assert probs[0] > 1 / 3 > probs[1], (objective, probs)
    assert int(metrics["skipped"]) == 0 and float(metrics["grad_norm"]) > 0
    assert float(metrics["entropy"]) == pytest.approx(math.log(3), rel=1e-5)  # before the step
    same, _, _ = update_lib.learn_update(
        params, tx.init(params), jnp.float32(0.0), gen, jax.random.key(0), logp=_toy_logp,
        ref_logp=None, tx=tx, learn=learn, weights_R=np.ones(1))
    np.testing.assert_array_equal(same["logits_V"], params["logits_V"])  # rate 0: unchanged


def test_grpo_and_vpo_advantages_are_the_objectives_own():
    gen = _toy_generation([[[1.0, 0.0], [0.0, 0.0], [0.5, 0.5]]],
                          [[[True, False], [True, True], [True, True]]])
    adv, _ = update_lib.advantages_BG(LearnConfig(objective="grpo"), None, gen, np.ones(1))
    want, _ = objectives.grpo_advantages(jnp.asarray([[1.0, 0.0, 1.0]]))
    np.testing.assert_allclose(adv, want)
    key = jax.random.key(3)
    adv, _ = update_lib.advantages_BG(LearnConfig(objective="vpo", num_weights=8), key, gen,
                                      np.ones(1))
    want, _ = objectives.vpo_advantages(key, gen.rewards_BGMR, gen.valid_BGM, num_weights=8)
    np.testing.assert_allclose(adv, want)


def test_entropic_advantage_follows_its_formula():
    r = np.array([1.0, 0.5, 0.0, 0.2])
    adv, metrics = objectives.entropic_advantages(jnp.asarray(r[None]))
    beta = float(objectives.entropic_beta(jnp.asarray(r[None]))[0])

    def kl(b):
        q = np.exp(b * r) / np.exp(b * r).sum()
        return float(np.sum(q * np.log(q * len(r))))

    assert kl(beta) == pytest.approx(math.log(2), abs=1e-5)
    assert kl(0.99 * beta) < math.log(2) < kl(1.01 * beta)  # the one root (KL grows with beta)
    e = np.exp(beta * (r - r.max()))
    w = np.array([e[i] / np.mean(np.delete(e, i)) for i in range(len(r))])
    np.testing.assert_allclose(np.asarray(adv)[0], w - 1, rtol=1e-4, atol=1e-5)
    assert float(metrics["entropic/kl_mean"]) == pytest.approx(math.log(2), abs=1e-5)
    # a constant group: beta 0 and no advantage; two groups at once, each its own beta
    adv2, _ = objectives.entropic_advantages(jnp.asarray([r, [0.3] * 4]))
    np.testing.assert_allclose(np.asarray(adv2)[0], np.asarray(adv)[0], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(adv2)[1], 0.0)
    # shifting or scaling the rewards changes beta, not the advantage
    adv3, _ = objectives.entropic_advantages(jnp.asarray(3 * r[None] + 1))
    np.testing.assert_allclose(np.asarray(adv3), np.asarray(adv), rtol=1e-4, atol=1e-5)


def test_what_cannot_learn_is_a_named_error():
    arithmetic = make_task("arithmetic")
    host = bind(arithmetic, task_word_tokenizer(arithmetic))
    with pytest.raises(ConfigError, match="scores on the host"):
        learn_search.check_learning(host, CFG, LEARN)
    for rate in (0.0, -1e-3):
        with pytest.raises(ConfigError, match="learn.learning_rate"):
            LearnConfig(learning_rate=rate)
    with pytest.raises(ConfigError, match="learn.every"):
        LearnConfig(every=0)
    with pytest.raises(ConfigError, match="learn.objective: must be one of grpo, vpo, entropic"):
        LearnConfig(objective="ppo")
    text_task = make_task("program", difficulty="easy")
    task = bind(text_task, task_word_tokenizer(text_task))
    one = ingraph.SearchConfig(islands=2, members=2, parents=1, children=4, num_answers=1)
    with pytest.raises(ConfigError, match="vpo .* needs search.num_answers >= 2; got 1"):
        learn_search.check_learning(task, one, LearnConfig(objective="vpo"))
    learn_search.check_learning(task, one, LearnConfig(objective="grpo"))  # 4 calls: fine
    two_calls = ingraph.SearchConfig(islands=2, members=2, parents=1, children=4, num_answers=2)
    with pytest.raises(ConfigError, match="entropic .* >= 3; got 4 / 2 = 2"):
        learn_search.check_learning(task, two_calls, LearnConfig(objective="entropic"))
    single = ingraph.SearchConfig(islands=2, members=2, parents=1, children=2, num_answers=2)
    with pytest.raises(ConfigError, match="grpo .* >= 2; got 2 / 2 = 1"):
        learn_search.check_learning(task, single, LearnConfig(objective="grpo"))
    with pytest.raises(ValueError, match="G >= 2"):
        objectives.entropic_advantages(jnp.zeros((1, 1)))
