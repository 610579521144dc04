"""SFT warm starts (`vpo.rl.sft.run_sft`): one policy on a mixture of answer counts, plain and
search-mutation demonstrations, a bad mutation fraction named, and SFT on maze demonstrations
solving mazes. SFT then RL through the loop is in test_rl_loop.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.rl.test_rl_step import bound, prompt_len
from vpo.config import SamplerConfig, model_preset
from vpo.launch.rules import load_task
from vpo.rl import sft as sft_lib
from vpo.rl import step as step_lib
from vpo.rollout import rewards as rewards_lib
from vpo.tasks import make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer


@pytest.fixture(scope="module")
def program_task():
    task = make_task("program", difficulty="easy")
    return bind(task, task_word_tokenizer(task))


def test_one_warm_start_mixes_answer_counts(monkeypatch):
    """`run_sft` with several m trains one policy on 1-answer and 3-answer prompts (and their
    mutation prompts) in every batch: each batch the step sees holds demonstrations of both
    answer counts, plain and mutation rows split as `_split_rows` says."""
    task = load_task("maze")  # the 5x5 maze with its word-level tokenizer
    need = max(seq_len_for(task, task.make_problems(0, 8), m, num_parents=2) for m in (1, 3))
    mcfg = model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need + 16)
    assert sft_lib._split_rows(8, 3) == [3, 3, 2]
    batches = []
    compiled = sft_lib.compiled_on_first_call

    def recording(step):
        run = compiled(step)

        def call(state, batch):
            batches.append(jax.device_get(batch))
            return run(state, batch)
        return call

    monkeypatch.setattr(sft_lib, "compiled_on_first_call", recording)
    _, state, losses = sft_lib.run_sft(task, mcfg, 2, batch_size=8, num_answers=(1, 3),
                                   num_demos=4, mutation_fraction=0.5)
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and int(state.step) == 2
    assert len(batches) == 2

    def answers_in(target_T) -> int:
        text = task.tokenizer.decode(target_T, skip_special_tokens=False)
        return max(k for k in range(1, 4) if f"</answer {k}>" in text)

    for batch in batches:
        counts = [answers_in(t) for t in batch["target_BT"]]
        # rows: 2 plain 1-answer, 2 plain 3-answer, 2 mutation 1-answer, 2 mutation 3-answer
        assert counts == [1, 1, 3, 3, 1, 1, 3, 3], counts


@pytest.mark.slow
def test_run_sft_mixes_mutation_demonstrations_by_default(program_task):
    """Default SFT trains on plain + mutation-prompt demonstrations (mutation_fraction=0.5)
    without the too-short-model fallback warning; a bad fraction names the field."""
    import warnings

    from vpo.rl.sft import run_sft

    task = program_task
    need = seq_len_for(task, task.make_problems(0, 1), 2, num_parents=2)
    cfg = model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need)
    with pytest.raises(ValueError, match="mutation_fraction"):
        run_sft(task, cfg, 1, mutation_fraction=1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback warning would fail here
        _, _, losses = run_sft(task, cfg, 3, batch_size=8, num_answers=2, num_demos=16)
    assert len(losses) == 3 and np.all(np.isfinite(losses))


def solved_fraction(model, task, records, num_answers, num_samples, key) -> float:
    """Share of sampled generations (`num_samples` per problem) with a solving answer."""
    from vpo.rollout import slots

    prompts, mask = task.prompt_arrays(records, num_answers)
    tok = task.tokenizer
    rollout = slots.sample(model, prompts, mask, key,
                           SamplerConfig(task.completion_len(num_answers), num_samples),
                           stop_ids=tok.stop_ids, pad_id=tok.pad_id)

    @jax.jit
    def solved(problems, tokens_BGT, mask_BGT):
        r, ok = rewards_lib.in_graph_rewards(task, problems, tokens_BGT, mask_BGT, num_answers)
        return jnp.mean(jnp.any(jax.vmap(jax.vmap(jax.vmap(task.solved)))(r) & ok, axis=-1))

    return float(solved(task.problem_arrays(records), rollout.tokens_BGT, rollout.mask_BGT))


def test_sft_learns_maze_demonstrations():
    maze = bound("maze")
    T = maze.completion_len(1)
    cfg = model_preset("tiny", vocab_size=maze.tokenizer.size, max_seq_len=prompt_len(maze, 1) + T)
    graphdef, state, losses = sft_lib.run_sft(maze, cfg, 150, batch_size=32,
                                                learning_rate=5e-3, num_demos=256,
                                                mutation_fraction=0.0)
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:5])
    model = step_lib.model_of(graphdef, state)
    assert solved_fraction(model, maze, maze.make_problems(123, 64), 1, 4,
                           jax.random.key(0)) > 0.05
