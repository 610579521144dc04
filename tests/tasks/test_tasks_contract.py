"""The text Task contract through `bind(task, tokenizer)`, for every task x tokenizer (the task's
word-level tokenizer and the byte-level BPE of tests/fixtures/hf/qwen2_bpe): prompts round trip
through the chat template, demonstrations fit the budget and score, the in-graph reward equals
the host scorer exactly on demonstrations, random tokens and adversarial text, and in-graph
mutation prompts decode to `mutation_text`."""

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.io.tokenizer import load_tokenizer
from vpo.tasks import answers, base, make_task
from vpo.tasks.bound import bind
from vpo.tasks.prompts import answer_instruction, mutation_text, prompt_text
from vpo.tasks.words import task_word_tokenizer

BPE = pathlib.Path(__file__).parent.parent / "fixtures" / "hf" / "qwen2_bpe"
TASKS = ("maze", "program", "codeword", "bandit", "arithmetic", "countdown2")
M = 3  # answers per generation
K = 3  # parents in a mutation prompt
UNK = 3  # the word-level tokenizer's <unk>
TAGS = re.compile("(" + "|".join(re.escape(t) for t in answers.tag_strings()) + ")")


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return load_tokenizer(BPE)


@pytest.fixture(scope="module", params=TASKS)
def task(request):
    return make_task(request.param)


@pytest.fixture(scope="module", params=("word", "bpe"))
def bound(request, task, bpe_tokenizer):
    tok = task_word_tokenizer(task) if request.param == "word" else bpe_tokenizer
    return bind(task, tok)


@pytest.fixture(scope="module")
def records(bound):
    return bound.make_problems(7, 3)


def _is_bpe(bound) -> bool:
    return bound.tokenizer.chat_template is not None


def _word_split(text: str) -> list[str]:
    """Text as the word-level tokenizer splits it: answer tags first, then whitespace."""
    return [w for piece in TAGS.split(text)
            for w in ([piece] if TAGS.fullmatch(piece) else piece.split())]


# -- problems and prompts ----------------------------------------------------------------------

def test_make_problems_are_deterministic_json_records(task):
    a, b = task.make_problems(3, 4), task.make_problems(3, 4)
    assert a == b and len(a) == 4
    assert json.loads(json.dumps(a)) == a
    if task.name != "bandit":  # the bandit has one fixed statement
        assert task.make_problems(4, 4) != a
    for r in a:
        s = task.statement(r)
        assert s == s.strip() and s


def test_prompts_round_trip(bound, records):
    tok = bound.tokenizer
    for m in (1, M):
        prompts, mask = bound.prompt_arrays(records, m)
        assert prompts.dtype == np.int32 and prompts.shape == mask.shape
        for r, row, keep in zip(records, prompts, mask, strict=True):
            ids = bound.prompt_ids(r, m)
            assert keep.sum() == len(ids) and np.all(keep[-len(ids):])  # left-padded
            assert row[keep].tolist() == ids and np.all(row[~keep] == tok.pad_id)
            text = prompt_text(bound.task, r, m)
            assert answer_instruction(bound.task, m) in text
            if _is_bpe(bound):
                assert tok.decode(ids, skip_special_tokens=False) == tok.prompt_text(text)
                assert ids == tok.encode(tok.prompt_text(text))
            else:
                assert ids[0] == tok.bos_id and UNK not in ids
                pieces = [tok.backend.id_to_token(i) for i in ids[1:]]
                assert " ".join(pieces) == " ".join(text.split())
                # each fixed sentence of the template (legend, instruction) is one token
                assert answer_instruction(bound.task, m) in pieces
                assert len(pieces) < len(_word_split(text))
    with pytest.raises(ValueError, match="num_answers"):
        bound.prompt_arrays(records, bound.task.max_answers + 1)
    with pytest.raises(ValueError, match="prompt 0 has"):
        bound.prompt_arrays(records, M, length=2)


def test_solved_is_a_jittable_predicate(task):
    ones = jnp.ones((task.num_rewards,), jnp.float32)
    assert bool(jax.jit(task.solved)(ones)) and not bool(jax.jit(task.solved)(0 * ones))


def test_contract_validation(task):
    fields = {f: getattr(task, f) for f in task.__dataclass_fields__}
    with pytest.raises(ValueError, match="eval_weights_R"):
        base.Task(**{**fields, "eval_weights_R": np.ones(task.num_rewards + 1)})
    with pytest.raises(ValueError, match="max_answers"):
        base.Task(**{**fields, "max_answers": 10})
    if not task.is_host:
        with pytest.raises(ValueError, match="in-graph scoring"):
            base.Task(**{**fields, "symbol_reward": None})
        with pytest.raises(ValueError, match="symbols"):
            base.Task(**{**fields, "symbols": (*task.symbols, task.symbols[0])})
    with pytest.raises(ValueError, match="num_answers"):
        task.check_num_answers(0)


# -- completions: demonstrations, random tokens, adversarial text -----------------------------

def _adversarial(task, demos: list[str]) -> list[tuple[str, list, bool | None, list | None]]:
    """(name, pieces, bpe_only, expected valid_M) from one problem's 3 demonstrated answers.
    `pieces`: texts encoded one by one and concatenated (so tags can be split over tokens), or
    the int "STOP" marker. Expectations are None where they depend on the task."""
    a1, a2, a3 = demos
    symbol = not task.is_host
    w1 = a1.split()
    foreign = "Give"  # a word of every prompt (in the word vocabulary), never a symbol
    fmt = answers.format_answers
    full = fmt([a1, a2, a3])
    return [
        ("well formed", [full], False, [True, True, True]),
        ("truncated", [full[:full.rindex("</answer 3>")]], False, [True, True, False]),
        ("close tag cut", [full[:-2]], True, [True, True, False]),
        ("empty", [f"<answer 1> </answer 1>\n<answer 2> {a2} </answer 2><answer 3></answer 3>"],
         False, [False, True, False]),
        ("duplicate", [fmt([a1, a1.replace(" ", "  "), a2])], False, [True, False, True]),
        ("out of order", [f"<answer 2> {a2} </answer 2>\n<answer 3> {a3} </answer 3>\n"
                          f"<answer 1> {a1} </answer 1>"], False, [True, True, True]),
        ("text outside", [f"Give different answers, each <answer 1> {a1} </answer 1> to "
                          f"<answer 2> {a2} </answer 2> ... <answer 3> {a3} </answer 3> "
                          "each"], False, [True, True, True]),
        ("stray <", [fmt([f"{w1[0]} < {' '.join(w1[1:])}", a2, a3])], True,
         [False, True, True] if symbol else None),
        ("glued <", [fmt([a1 + "<", a2 + ">", a3])], True,
         [False, False, True] if symbol else None),
        ("too many words", [fmt([" ".join([w1[0]] * (task.answer_len + 1)), a2, a3])], False,
         [False, True, True]),
        ("wrong case", [fmt([a1.swapcase(), a2.lower(), a3.upper()])], True, None),
        ("foreign word", [fmt([f"{a1} {foreign}", a2, f"{foreign} {a3}"])], False,
         [False, True, False] if symbol else None),
        ("nested", [f"<answer 1> {a1} <answer 2> {a2} </answer 2> </answer 1>\n"
                    f"<answer 3> {a3} </answer 3>"], False,
         [False, True, True] if symbol else None),
        ("foreign close inside", [f"<answer 1> {a1} </answer 3> </answer 1>"], False,
         [False, False, False] if symbol else None),
        ("split tags", ["<", "ans", "wer", " 1", ">", f" {a1} ", "</", "answer 1", ">\n<answer",
                        " 2> ", a2, " </answer 2", ">\n<answ", "er 3> ", a3[:1], a3[1:],
                        " </answer 3>"], True, [True, True, True]),
        ("after stop", [fmt([a1]), "STOP", f"\n<answer 2> {a2} </answer 2>\n<answer 3> {a3} "
                        "</answer 3>"], False, [True, False, False]),
        ("after second stop", [fmt([a1, a2]), "STOP2", "\n<answer 3> " + a3 + " </answer 3>"],
         False, [True, True, False]),
        ("whitespace", [f"<answer 1>\t{a1.replace(' ', chr(10) + chr(9))}\n</answer 1>\n\n"
                        f"<answer 2>   {a2.replace(' ', '   ')}   </answer 2>\r\n"
                        f"<answer 3>\n{a3}\n</answer 3>"], False, [True, True, True]),
        ("glued tags", [f"<answer 1>{a1}</answer 1><answer 2>{a2}</answer 2>"
                        f"<answer 3>{a3}</answer 3>"], True, [True, True, True]),
        ("non-ascii", [f"<answer 1> {a1} é </answer 1> 日本語 🙂 <answer 2> {a2} </answer 2>"],
         True, [False, True, False] if symbol else None),
        ("extra answers", [fmt([a1, a2, a3, a1])], False, [True, True, True]),
        ("only close tags", ["</answer 1> </answer 2> </answer 3> " + a1], False,
         [False, False, False]),
        ("nothing", [""], False, [False, False, False]),
    ]


def _encode_pieces(bound, pieces) -> list[int]:
    tok = bound.tokenizer
    ids: list[int] = []
    for p in pieces:
        if p == "STOP":
            ids.append(tok.stop_ids[0])
        elif p == "STOP2":
            ids.append(tok.stop_ids[-1])
        else:
            ids += tok.encode(p)
    return ids


def _stop_mask(ids, T, stop_ids) -> np.ndarray:
    """The sampler's mask: True up to and including the first stop id."""
    ends = [i for i, t in enumerate(ids) if t in stop_ids]
    n = ends[0] + 1 if ends else len(ids)
    return np.arange(T) < min(n, T)


@pytest.fixture(scope="module")
def graded(bound, records):
    """Every completion row for one (task, tokenizer), scored by the host and (in-graph tasks)
    by the jitted, vmapped in-graph reward, compiled once."""
    tok, task = bound.tokenizer, bound.task
    rng = np.random.default_rng(0)
    rows = []  # (kind, problem index, ids, mask or None, expected valid_M or None, source text)
    demo_ids = []
    for i, r in enumerate(records):
        for m in (1, M):
            ids = bound.demonstration_ids(r, np.random.default_rng(i), m)
            rows.append(("demo", i, ids, None, [True] * m + [False] * (M - m), None))
            demo_ids.append(ids)
        demos = task.demonstrations(r, np.random.default_rng(100 + i), M)
        for name, pieces, bpe_only, expect in _adversarial(task, demos):
            ids = _encode_pieces(bound, pieces)
            exact = _is_bpe(bound) or not bpe_only  # the word vocabulary lacks some pieces
            stop = any(p in ("STOP", "STOP2") for p in pieces)
            rows.append((name, i, ids, None, expect if exact else None,
                         "".join(pieces) if exact and not stop else None))
        full = bound.answers_ids(demos)
        for n in rng.integers(0, len(full) + 1, size=6):  # cut by the mask
            rows.append(("mask cut", i, full, np.arange(len(full)) < n, None, None))
    pool = sorted({t for ids in demo_ids for t in ids} | set(tok.stop_ids) | {tok.pad_id})
    for n in range(120):  # random tokens: uniform, from the demonstrations' tokens, edited demos
        i = n % len(records)
        L = int(rng.integers(0, bound.completion_len(M) + 1))
        if n % 3 == 0:
            ids = rng.integers(0, tok.size, size=L).tolist()
        elif n % 3 == 1:
            ids = rng.choice(pool, size=L).tolist()
        else:
            ids = list(demo_ids[int(rng.integers(len(demo_ids)))])
            for _ in range(int(rng.integers(1, 4))):
                j = int(rng.integers(len(ids)))
                kind = int(rng.integers(3))
                if kind == 0:
                    ids[j] = int(rng.choice(pool))
                elif kind == 1:
                    del ids[j]
                else:
                    ids.insert(j, int(rng.choice(pool)))
        mask = np.arange(len(ids)) < int(rng.integers(0, len(ids) + 1)) if n % 2 else None
        rows.append(("random", i, ids, mask, None, None))

    T = max(len(r[2]) for r in rows)
    tokens = np.full((len(rows), T), tok.pad_id, np.int32)
    mask = np.zeros((len(rows), T), bool)
    for j, (_, _, ids, mk, _, _) in enumerate(rows):
        tokens[j, :len(ids)] = ids
        mask[j] = (_stop_mask(ids, T, tok.stop_ids) if mk is None
                   else np.arange(T) < int(np.sum(mk)))
    row_records = [records[r[1]] for r in rows]
    host = bound.host_score(row_records, tokens, mask, M)
    graph = None
    if not task.is_host:
        fn = jax.jit(jax.vmap(lambda p, t, mk: bound.reward(p, t, mk, M)))
        problems = jax.tree.map(np.asarray, task.arrays(row_records))
        graph = tuple(np.asarray(x) for x in fn(problems, tokens, mask))
    return dict(rows=rows, tokens=tokens, mask=mask, records=row_records, host=host, graph=graph)


def test_demonstrations_fit_end_with_stop_and_score(bound, records, graded):
    tok, task = bound.tokenizer, bound.task
    for i, r in enumerate(records):
        for m in (1, M):
            ids = bound.demonstration_ids(r, np.random.default_rng(i), m)
            assert len(ids) <= bound.completion_len(m), (m, len(ids))
            assert ids[-1] == tok.eos_id == tok.stop_ids[0]
            assert not set(ids[:-1]) & set(tok.stop_ids)
            if not _is_bpe(bound):
                assert UNK not in ids
    rewards, valid = graded["host"]
    for j, row in enumerate(graded["rows"]):
        if row[0] == "demo":
            np.testing.assert_array_equal(valid[j], row[4])
            n = int(np.sum(row[4]))
            assert np.all(rewards[j, :n] @ task.eval_weights_R > 0)
            assert np.all(rewards[j, n:] == 0)
    assert np.all((rewards >= 0) & (rewards <= 1))


def test_in_graph_reward_equals_host_score(bound, graded):
    if bound.is_host:
        with pytest.raises(ValueError, match="host"):
            bound.reward(None, graded["tokens"][0], graded["mask"][0], M)
        pytest.skip("host-scored task: no in-graph reward")
    rewards_h, valid_h = graded["host"]
    rewards_g, valid_g = graded["graph"]
    assert rewards_g.dtype == np.float32 and valid_g.dtype == bool
    assert rewards_g.shape == rewards_h.shape == (len(graded["rows"]), M, bound.num_rewards)
    bad = [(j, graded["rows"][j][0]) for j in range(len(graded["rows"]))
           if not (np.array_equal(valid_g[j], valid_h[j])
                   and np.array_equal(rewards_g[j], rewards_h[j]))]
    assert bad == [], bad[:10]
    kinds = {row[0] for row, v in zip(graded["rows"], valid_h, strict=True) if v.any()}
    assert {"demo", "mask cut", "random"} <= kinds  # the random rows are not all trivial


def test_adversarial_completions_expected_validity(bound, graded):
    _, valid = graded["host"]
    wrong = [(row[0], row[1], valid[j].tolist(), row[4])
             for j, row in enumerate(graded["rows"])
             if row[0] not in ("demo", "mask cut", "random") and row[4] is not None
             and valid[j].tolist() != row[4]]
    assert wrong == [], wrong


def test_host_score_reads_the_text(bound, graded):
    """BPE is lossless: host_score on the tokens of a text == the task's score of the answers
    parsed from that text (arithmetic included: the host parse is the only reader)."""
    if not _is_bpe(bound):
        texts = bound.completion_texts(graded["tokens"], graded["mask"])
        for j, row in enumerate(graded["rows"]):
            if row[5] is not None:
                assert UNK not in row[2], row[0]
                assert texts[j].split() == " ".join(_word_split(row[5])).split(), row[0]
        return
    rewards, valid = graded["host"]
    sources = [(j, row[5]) for j, row in enumerate(graded["rows"]) if row[5] is not None]
    assert len(sources) > 20
    for j, text in sources:
        assert bound.tokenizer.completion_text(graded["tokens"][j][graded["mask"][j]]) == text
    want_r, want_v = bound.task.score([graded["records"][j] for j, _ in sources],
                                      [answers.parse_answers(t, M) for _, t in sources])
    np.testing.assert_array_equal(rewards[[j for j, _ in sources]], want_r)
    np.testing.assert_array_equal(valid[[j for j, _ in sources]], want_v)


# -- mutation prompts ------------------------------------------------------------------------

def test_mutation_prompts_decode_to_mutation_text(bound, records):
    task, tok = bound.task, bound.tokenizer
    if task.is_host:
        with pytest.raises(ValueError, match="symbol task"):
            bound.mutation_prompt_len(4, K, M)
        pytest.skip("host-scored task: no in-graph mutation prompt")
    rng = np.random.default_rng(3)
    parents = []
    for i, r in enumerate(records):
        if task.mutation_demonstrations is not None:
            ps = task.mutation_demonstrations(r, rng, 2, M)[0]
        else:
            ps = task.demonstrations(r, rng, 2)
        # an invalid parent first (left out: the next one is "Answer 1"), or fewer than K
        parents.append([f"{ps[0]} Give", *ps] if i == 0 else ps[:K])
    out = bound.mutation_prompt_arrays(records, parents, M, K)
    head_len = bound.mutation_heads(records)[0].shape[1]
    prompts, pmask = out["prompt_BP"], out["prompt_mask_BP"]
    assert prompts.shape == (len(records), bound.mutation_prompt_len(head_len, K, M))
    assert out["parent_rewards_BUR"].shape == (len(records), K, bound.num_rewards)
    assert not out["parent_valid_BU"][0, 0] and out["parent_valid_BU"][0, 1:len(parents[0])].all()
    for i, r in enumerate(records):
        keep = pmask[i]
        n = int(keep.sum())
        assert np.all(keep[-n:]) and np.all(prompts[i][~keep] == tok.pad_id)
        shown = []
        for k, p in enumerate(parents[i][:K]):
            rew, val = task.score([r], [[p]])
            assert bool(val[0, 0]) == bool(out["parent_valid_BU"][i, k])
            np.testing.assert_array_equal(out["parent_rewards_BUR"][i, k], rew[0, 0])
            if val[0, 0]:
                shown.append((p, rew[0, 0]))
        text = mutation_text(task, r, shown, M)
        ids = prompts[i][keep].tolist()
        if _is_bpe(bound):
            assert tok.decode(ids, skip_special_tokens=False) == tok.prompt_text(text)
        else:
            assert UNK not in ids and ids == tok.prompt_ids(text)


def test_mutation_scores_round_like_mutation_text(bpe_tokenizer):
    """Half-way tenths (0.35, 0.85 in float32) are written as mutation_text writes them."""
    bound = bind(make_task("bandit"), bpe_tokenizer)
    records = bound.make_problems(0, 1)
    head, hmask = bound.mutation_heads(records)
    values = np.array([[0.05, 0.35], [0.85, 0.95], [0.25, 0.65], [1.0, 0.0]], np.float32)
    parents = np.array([[0], [1], [2], [0]], np.int32)
    fn = jax.jit(lambda r: bound.mutation_prompt(head[0], hmask[0], parents,
                                                 np.ones((4, 1), bool), r, 1))
    tokens, mask = (np.asarray(x) for x in fn(values))
    shown = [(bound.task.symbols[p[0]], v) for p, v in zip(parents, values, strict=True)]
    want = bpe_tokenizer.prompt_text(mutation_text(bound.task, records[0], shown, 1))
    assert bpe_tokenizer.decode(tokens[mask], skip_special_tokens=False) == want


def test_mutation_demonstrations_improve_on_their_parents(task):
    if task.mutation_demonstrations is None:
        pytest.skip("no mutation demonstrations")
    rng = np.random.default_rng(1)
    for r in task.make_problems(5, 3):
        parents, children = task.mutation_demonstrations(r, rng, 2, M)
        assert 1 <= len(parents) <= 2 and len(children) == M
        crew, cvalid = task.score([r], [children])
        assert cvalid.all()
        prew, pvalid = task.score([r] * len(parents), [[p] for p in parents])
        assert pvalid.all()
        assert (crew[0] @ task.eval_weights_R).min() > (prew[:, 0] @ task.eval_weights_R).max()


# -- a custom task's outputs, checked where they are called -------------------------------------

def _bandit_with(**fields):
    import dataclasses

    task = dataclasses.replace(make_task("bandit"), **fields)
    return bind(task, task_word_tokenizer(task))


@pytest.mark.parametrize("symbol_reward, words", [
    (lambda p, s, m: jnp.zeros((3, 2)), r"returned shape \(3, 2\) for one answer"),
    (lambda p, s, m: jnp.zeros(()), r"returned shape \(\) for one answer"),
    (lambda p, s, m: [jnp.zeros(()), jnp.zeros(())], "returned list, not an array"),
    (lambda p, s, m: jnp.zeros((2,), jnp.complex64), "returned dtype complex64"),
])
def test_a_bad_symbol_reward_is_named_at_trace_time(symbol_reward, words):
    """Not "dot_general requires contracting dimensions" deep inside the step's jit."""
    from vpo.errors import RewardError

    bound = _bandit_with(symbol_reward=symbol_reward)
    problem = jax.tree.map(lambda x: x[0], bound.problem_arrays(bound.make_problems(0, 1))["task"])
    T = bound.completion_len(1)
    with pytest.raises(RewardError, match=rf"task 'bandit': symbol_reward {words}.*shape \(2,\), "
                                          r"\(first, second\)"):
        jax.jit(lambda t, m: bound.reward(problem, t, m, 1))(jnp.zeros((T,), jnp.int32),
                                                             jnp.ones((T,), bool))


@pytest.mark.parametrize("score, words", [
    (lambda r, a: None, "it returned None"),
    (lambda r, a: (np.zeros((len(r), 1)),), r"it returned \(array"),
    (lambda r, a: (np.zeros((len(r), 2)), np.ones((len(r), 1), bool)),
     r"its rewards_NMR has shape \(2, 2\)"),
    (lambda r, a: (np.zeros((len(r), 1, 2)), np.ones((len(r), 3), bool)),
     r"its valid_NM has shape \(2, 3\)"),
    (lambda r, a: ([["x", "y"]] * len(r), np.ones((len(r), 1), bool)),
     "its rewards_NMR is not numeric"),
])
def test_a_bad_host_score_is_named(score, words):
    from vpo.errors import RewardError

    bound = _bandit_with(score=score)
    records = bound.make_problems(0, 2)
    with pytest.raises(RewardError, match=r"task 'bandit': score\(records, answers\) for 2 "
                                          r"problems x 1 answer slots must return \(rewards_NMR "
                                          rf"\(2, 1, 2\), valid_NM \(2, 1\)\).*; {words}"):
        bound.host_score(records, np.zeros((2, 4), np.int32), np.ones((2, 4), bool), 1)


def test_a_non_finite_host_score_names_the_problem_and_slot():
    from vpo.errors import RewardError

    def score(records, answers):
        rewards = np.zeros((len(records), 2, 2), np.float32)
        rewards[1, 1, 0] = np.inf
        return rewards, np.ones((len(records), 2), bool)

    bound = _bandit_with(score=score)
    with pytest.raises(RewardError, match=r"score gave a non-finite reward inf for component "
                                          r"'first' of answer slot 2 of problem \{'index': 1\}"):
        bound.host_score(bound.make_problems(0, 2), np.zeros((2, 4), np.int32),
                         np.ones((2, 4), bool), 2)
    # an invalid slot may hold anything (it is masked)
    bound = _bandit_with(score=lambda r, a: (np.full((len(r), 1, 2), np.nan),
                                             np.zeros((len(r), 1), bool)))
    rewards, valid = bound.host_score(bound.make_problems(0, 2), np.zeros((2, 4), np.int32),
                                      np.ones((2, 4), bool), 1)
    assert not valid.any()


def test_problem_files_are_checked_against_the_task(tmp_path, bpe_tokenizer):
    """A maze grid of another size, numbers the word-level tokenizer cannot write: refused at the
    file's line, not mid-run ("all input arrays must have the same shape") or as a silent <unk>."""
    from vpo.errors import ConfigError
    from vpo.run.data import load_jsonl_records

    maze = make_task("maze")
    maze_file = tmp_path / "maze.jsonl"
    maze_file.write_text(json.dumps(maze.make_problems(0, 1)[0]) + "\n"
                         + json.dumps(make_task("maze9").make_problems(0, 1)[0]) + "\n")
    with pytest.raises(ConfigError, match=r"maze.jsonl:2: maze\w* reads this problem's grid with "
                                          r"shape \(9, 9\), its own problems' with \(\d, \d\)"):
        load_jsonl_records(str(maze_file), maze)
    arithmetic = make_task("arithmetic")
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"numbers": [3, 4, 5], "target": 35}\n'
                       '{"numbers": [3, 4, 500], "target": 1234}\n')
    with pytest.raises(ConfigError, match=r"numbers.jsonl:2: arithmetic: '500', '1234' are not "
                                          r"in the tokenizer's vocabulary \(the task's own words; "
                                          r"its numbers are 0..99\) and would reach the model as "
                                          r"<unk>"):
        load_jsonl_records(str(numbers), bind(arithmetic, task_word_tokenizer(arithmetic)))
    # a byte-level BPE writes any number
    assert len(load_jsonl_records(str(numbers), bind(arithmetic, bpe_tokenizer))) == 2
