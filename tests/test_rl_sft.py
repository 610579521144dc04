"""SFT warm starts (`vpo.rl.sft.run_sft`): one policy on a mixture of answer counts, plain and
search-mutation demonstrations, a bad mutation fraction named. The SFT-then-RL tests that need
the RL step live in test_train.py."""

import numpy as np
import pytest

from vpo.compare import config as compare_config
from vpo.compare import driver as compare
from vpo.config import model_preset
from vpo.tasks import make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer


@pytest.fixture(scope="module")
def program_task():
    task = make_task("program", difficulty="easy")
    return bind(task, task_word_tokenizer(task))


def test_one_warm_start_mixes_answer_counts():
    """`run_sft` with several m trains one policy on 1-answer and 3-answer prompts (and their
    mutation prompts) in every batch."""
    from vpo.rl import sft

    cfg = compare_config.make_config("smoke")
    task = compare.make_task(cfg)
    need = max(seq_len_for(task, task.make_problems(0, 8), m, num_parents=2) for m in (1, 3))
    mcfg = model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need + 16)
    assert sft._split_rows(8, 3) == [3, 3, 2]
    _, state, losses = sft.run_sft(task, mcfg, 2, batch_size=8, num_answers=(1, 3),
                                   num_demos=4, mutation_fraction=0.5)
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and int(state.step) == 2


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
