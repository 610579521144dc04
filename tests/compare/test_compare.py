"""vpo compare: config validation, the entropy-law fit, t-intervals, the one warm start, and the
smoke preset end to end (report, PNGs, finite and consistent numbers, three-way verdicts)."""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from vpo.cli import main as cli
from vpo.compare import arms as compare_arms
from vpo.compare import config as compare_config
from vpo.compare import driver
from vpo.compare import gate as compare_gate
from vpo.compare import numbers as compare_numbers
from vpo.compare import render as compare_render
from vpo.compare import resume as compare_resume
from vpo.compare.config import make_config
from vpo.config import ConfigError
from vpo.eval import entropy_law
from vpo.launch.rules import load_task


def test_entropy_law_fit_recovers_known_coefficients():
    H = np.linspace(1.5, 0.1, 40)
    a, b = 0.3, 1.2
    R = b - a * np.exp(H)
    assert entropy_law.fit_entropy_law(H, R) == pytest.approx((a, b), abs=1e-9)
    noisy = R + np.random.default_rng(0).normal(0, 0.01, H.shape)
    rep = entropy_law.entropy_law_report(H, noisy, bins=10)
    assert rep["a"] == pytest.approx(a, abs=0.05) and rep["b"] == pytest.approx(b, abs=0.05)
    assert rep["ceiling"] == pytest.approx(rep["b"] - rep["a"])
    assert rep["r2"] > 0.95 and rep["rmse_heldout"] < rep["rmse_constant"]
    flat = entropy_law.entropy_law_report(H, np.full_like(H, 0.5) + np.sin(np.arange(40)), bins=10)
    assert flat["r2"] < 0.5  # no entropy-reward relation: the law does not fit
    with pytest.raises(ValueError, match="need >= 4 steps"):
        entropy_law.entropy_law_report(H[:3], R[:3])


def test_mean_ci_is_a_student_t_interval():
    mean, hw = compare_numbers.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and hw == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)
    assert math.isnan(compare_numbers.mean_ci([0.7])[1])


@pytest.mark.parametrize("override, message", [
    ("arms=grpo,ppo", "unknown arm"),
    ("eval_budget=7", "eval_budget: 7 must be a multiple"),
    ("search.members=4", r"search\.members: 4 must be a multiple"),
    ("search_problems=99", "search_problems"),
    ("sft_steps=0", "sft_steps"),
    ("law_budget=4", "law_budget: 4 must be a multiple"),
    ("arms=grpo,grpo", "names an arm twice"),
    ("eval_temperature=0", "eval_temperature"),
    ("search_temperatures=1.0,hot", "search_temperatures"),
    ("search_temperatures=1.3,1.3", "named once"),
    ("search_temperatures=0,1.3", "each > 0"),
    # fields compare sets for every arm: an override would be lost, so it is refused
    ("sampler.max_new_tokens=80", r"sampler\.max_new_tokens: vpo compare sets it .*budget"),
    ("train.num_answers=2", r"train\.num_answers: .*num_answers=M"),
    ("train.mutation_parents=3", "search.parents"),
    ("train.checkpoint_every=5", "law_points=0"),
    ("search.num_answers=2", "own m answers"),
    ("objective.advantage=vpo", "arm grpo sets advantage='grpo'"),
])
def test_bad_compare_config_names_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        make_config("default", [override])


def test_overrides_an_arm_or_init_would_replace_are_refused():
    """An override takes effect in every arm, or is refused naming what sets it instead."""
    cfg = make_config("default", ["arms=grpo,vpo", "objective.cov_control=clip_cov"])
    assert cfg.objective.cov_control == "clip_cov"  # no arm of these sets it
    with pytest.raises(ConfigError, match="arm clip_cov sets cov_control='clip_cov'"):
        make_config("default", ["arms=grpo,clip_cov", "objective.cov_control=kl_cov"])
    with pytest.raises(ConfigError, match="arm grpo_mut sets mutation_fraction"):
        make_config("default", ["arms=grpo,grpo_mut", "train.mutation_fraction=0.1"])
    assert make_config("default", ["train.mutation_fraction=0.1"]).train.mutation_fraction \
        == 0.1
    with pytest.raises(ConfigError, match="model: .*init=/x/policy"):
        make_config("default", ["init=/x/policy", "model=small"])
    # with init= the SFT settings configure the warm start an unparsing init policy gets
    assert make_config("default", ["init=/x/policy", "sft_steps=50"]).sft_steps == 50
    with pytest.raises(ConfigError, match="lora_rank: .*init="):
        make_config("default", ["lora_rank=8"])


def test_presets_and_arm_configs(tmp_path):
    paper = make_config("paper")
    assert paper.objective.kl_coef == 1e-3 and paper.train.learning_rate == 1e-6
    assert paper.sampler.num_samples == 8 and paper.num_answers == 3
    assert paper.objective.num_weights == 100 and paper.objective.alpha == 1.0
    assert paper.eval_temperature == 0.7 and paper.eval_budget == 30
    full = make_config("full")
    assert full.task == "maze9" and full.num_seeds >= 5 and full.search_seeds >= 5
    assert set(full.arm_names) == set(compare_config.ARMS)
    for name in ("default", "maze"):
        cfg = make_config(name)
        assert cfg.arm_names == ["grpo", "clip_cov", "multi_rlvr", "vpo"]
        assert cfg.num_seeds >= 8 and cfg.search_problems >= 32
        assert cfg.primary.split(",")[0] == "vpo-grpo:search"
    assert make_config("default").task == "codeword"
    assert make_config("maze").task_kwargs == {"size": 7, "demos": "partial"}
    cfg = make_config("default", ["arms=" + ",".join(compare_config.ARMS)])
    assert cfg.eval_budget == 30 and cfg.eval_temperature == 0.7 and cfg.search_seeds >= 1
    task = load_task(cfg.task, None, cfg.task_kwargs)
    spec, policy = _saved_tiny_policy(tmp_path, task)
    runs = {a: compare_arms.arm_run_config(cfg, task, a, 3, spec, policy)[0] for a in cfg.arm_names}
    assert runs["grpo"].train.num_answers == 1 and runs["vpo"].train.num_answers == 3
    assert runs["multi_rlvr"].objective.advantage == "grpo"
    for arm in ("vpo", "maxk", "rw_grpo", "passk"):
        assert runs[arm].objective.advantage == arm and runs[arm].train.num_answers == (
            3 if arm == "vpo" else 1)
    assert runs["kl_cov"].objective.cov_control == "kl_cov"
    assert runs["vpo_mut"].train.mutation_fraction > 0 == runs["vpo"].train.mutation_fraction
    assert {r.train.seed for r in runs.values()} == {3}
    assert {(r.train.steps, r.sampler.num_samples, r.train.batch_size) for r in runs.values()} \
        == {(cfg.train.steps, cfg.sampler.num_samples, cfg.train.batch_size)}
    # the entropy law's checkpoints: law_points evenly spaced, all kept
    assert runs["grpo"].train.checkpoint_every * cfg.law_points == cfg.train.steps
    assert runs["grpo"].train.keep_checkpoints > cfg.law_points
    est = driver.estimate_seconds(cfg, task)
    assert est["total"] == pytest.approx(sum(v for k, v in est.items() if k != "total"))
    full_task = load_task(full.task, None, full.task_kwargs or None)
    quick = driver.estimate_seconds(make_config("default"), task)["total"]
    assert driver.estimate_seconds(full, full_task)["total"] > 2 * quick


def _saved_tiny_policy(tmp_path, task):
    """(policy folder, the policy): a fresh tiny decoder saved as a warm start would be."""
    from flax import nnx

    from vpo.config import model_preset
    from vpo.io import policy_folder
    from vpo.model.decoder import Decoder

    mcfg = model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=512)
    spec = str(tmp_path / "sft")
    policy = Decoder(mcfg, rngs=nnx.Rngs(0))
    policy_folder.save_policy(spec, mcfg, nnx.state(policy, nnx.Param), {"task": task.name},
                              tokenizer=task.tokenizer)
    return spec, policy


def test_an_arm_is_the_run_its_vpo_train_command_starts(tmp_path):
    """Each arm is assembled as `vpo train` assembles a run: the command recorded for an arm,
    parsed and assembled by `vpo train`'s own path (assemble_run, then load_init, which loads
    the warm start), gives the arm's RunConfig field for field."""
    import shlex

    from vpo.launch import assemble

    cfg = make_config("default", ["arms=grpo,vpo_mut,kl_cov", "law_points=2"])
    task = load_task(cfg.task, None, cfg.task_kwargs or None)
    spec, policy = _saved_tiny_policy(tmp_path, task)
    for arm in cfg.arm_names:
        run, overrides = compare_arms.arm_run_config(cfg, task, arm, 2, spec, policy)
        argv = shlex.split(compare_arms.train_command(spec, str(tmp_path / arm), overrides))[1:]
        args = cli._parse(argv)
        plan = assemble.assemble_run(args.preset, args.config, args.overrides, init=args.init)
        _, trained, _ = assemble.load_init(plan, args.config)
        assert trained == run, arm
        assert run.train.seed == 2 and run.objective == dataclasses.replace(
            cfg.objective, **compare_config.ARMS[arm].objective)


@pytest.mark.slow
def test_compare_smoke_writes_a_consistent_report(tmp_path):
    out = str(tmp_path / "cmp")
    assert cli.main(["compare", "--preset", "smoke", "arms=multi_rlvr,vpo", "sft_steps=20",
                     "train.steps=2", "law_points=2", "search_temperatures=1.3",
                     "--compile-cache", "", "--out", out]) == 0
    for name in ("report.md", "summary.json", "best_at_k.png", "pass_at_k.png", "training.png",
                 "budget_curves.png", "bridge.png", "entropy_law.png", "eval.md", "report.png",
                 "temperature.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    assert set(s["headline"]) == {"sft (m=1)", "sft (m=3)", "multi_rlvr", "vpo"}
    assert all(h["seeds"] == [0, 1] for h in s["headline"].values())  # rows pair by seed
    N, ks = s["config"]["eval_budget"], s["eval"]["ks"]
    for name, rows in s["eval"]["rows"].items():
        for r in rows:
            best = [r[f"best@{k}"] for k in ks]
            assert all(np.isfinite(best)) and best == sorted(best), name  # best@k rises with k
            assert 0.0 <= r[f"pass@{N}"] <= 1.0 and r["entropy"] > 0
            assert len(r["best_P"]) == s["config"]["eval_problems"]
    search = s["search"]
    assert len(search["problems"]) == s["config"]["search_problems"]
    assert search["budget"] == search["calibration"]["budget"]  # fixed before RL
    for name, rows in search["rows"].items():
        assert rows[0]["evaluated"][-1] == search["max_budget"], name  # equal candidate budget
        assert rows[0]["evaluated"][search["point"]] == search["budget"]
        assert np.shape(rows[0]["solved_SP"]) == (s["config"]["search_seeds"],
                                                  len(search["problems"]))
        assert set(rows[0]["first_SP"]) == {"search", "best_of_n"}  # smoke: search_best_of_n
    for arm in ("multi_rlvr", "vpo"):
        rows = s["train"][arm][0]["metrics"]
        assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["reward"]) for r in rows)
        traj = s["entropy_law"][arm]["trajectories"][0]
        assert traj["step"] == [0, 1, 2] and len(traj["score"]) == 3
    assert s["probe"] and set(s["probe"]["vpo"][0]) >= {"valid", "improve", "copy", "distinct"}
    # the temperature sweep: the warm start in its calibrated mode and the primary claims' arm
    temps = s["temperature"]
    warm = f"sft (m={search['calibration']['mode']})"
    assert temps["temperatures"] == [1.3] and set(temps["rows"]) == {warm, "vpo"}
    for name, recs in temps["rows"].items():
        assert [r["seed"] for r in recs] == [0, 1], name
        assert all(0 <= r["search"] <= len(search["problems"]) for r in recs)
    for r in [r for rs in temps["rows"].values() for r in rs] + [
            r for rs in search["rows"].values() for r in rs]:  # PROBE_FIELDS: beats <= calls
        mutated, mutated_beat, fresh, fresh_beat = r["probe"]
        assert 0 <= mutated_beat <= mutated and 0 <= fresh_beat <= fresh
    assert s["claims"] and {c["verdict"] for c in s["claims"]} <= {
        "reproduced", "refuted", "inconclusive"}
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    assert "| vpo | 3 | 2 |" in report and "## Claims" in report and "Solve matrix" in report
    assert "## Does search track what training keeps?" in report and "Budget curves" in report
    assert "## Search temperature" in report and f"| {warm} | 1.3 |" in report
    static = [a for a in ("multi_rlvr", "vpo")
              if all(m["grad_norm"] == 0 for r in s["train"][a] for m in r["metrics"])]
    assert ("No learning signal" in report) == bool(static)  # a vacuous comparison says so
    assert s["wall_s"]["total"] > 0

    # Interrupted after RL of one run and before the search: --resume reads the finished parts
    # back, redoes the rest, and the report is the same as the uninterrupted one.
    os.remove(os.path.join(out, "arms", "vpo", "seed1", compare_resume.ARM_DONE))
    os.remove(os.path.join(out, "stages", "search.json"))
    assert cli.main(["compare", "--preset", "smoke", "arms=multi_rlvr,vpo", "sft_steps=20",
                     "train.steps=2", "law_points=2", "search_temperatures=1.3",
                     "--compile-cache", "", "--out", out, "--resume"]) == 0
    with open(os.path.join(out, "summary.json")) as f:
        again = json.load(f)
    for key in ("headline", "eval", "search", "probe", "claims", "entropy_law", "temperature"):
        assert again[key] == s[key], key
    def untimed(train):  # a redone run measures its own step times
        return {arm: [{**r, "metrics": [{k: v for k, v in m.items() if not k.endswith("_s")}
                                        for m in r["metrics"]]} for r in rows]
                for arm, rows in train.items()}

    assert untimed(again["train"]) == untimed(s["train"])


def test_an_arm_that_never_had_a_gradient_is_static():
    from types import SimpleNamespace

    flat = [SimpleNamespace(metrics=[{"grad_norm": 0.0}, {"grad_norm": 0.0}])] * 2
    moved = [SimpleNamespace(metrics=[{"grad_norm": 0.0}, {"grad_norm": 0.3}]), flat[0]]
    assert compare_numbers.static_arms({"grpo": flat, "vpo": moved}) == ["grpo"]


def test_compare_never_replaces_a_folder_silently(tmp_path):
    cfg = make_config("smoke")
    out = str(tmp_path)
    with pytest.raises(ConfigError, match="holds no comparison"):
        compare_resume.check_out_dir(cfg, out, resume=True, overwrite=False)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(json.loads(json.dumps(dataclasses.asdict(cfg))), f)
    os.makedirs(os.path.join(out, "arms"))
    with pytest.raises(ConfigError, match="already holds a comparison.*--resume"):
        compare_resume.check_out_dir(cfg, out, resume=False, overwrite=False)
    compare_resume.check_out_dir(cfg, out, resume=True, overwrite=False)  # same settings: fine
    other = make_config("smoke", ["num_seeds=3", "train.steps=5"])
    with pytest.raises(ConfigError, match=r"num_seeds, train differ"):
        compare_resume.check_out_dir(other, out, resume=True, overwrite=False)
    with pytest.raises(ConfigError, match="choose one"):
        compare_resume.check_out_dir(cfg, out, resume=True, overwrite=True)
    # A comparison recorded before a setting existed resumes while that setting holds its
    # default, and is refused by name once it does not.
    recorded = json.loads(json.dumps(dataclasses.asdict(cfg)))
    del recorded["sampler"]["num_slots"], recorded["train"]["pack_rows"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(recorded, f)
    compare_resume.check_out_dir(cfg, out, resume=True, overwrite=False)
    with pytest.raises(ConfigError, match=r"\(sampler differ\)"):
        compare_resume.check_out_dir(make_config("smoke", ["sampler.num_slots=2"]), out,
                              resume=True, overwrite=False)
    with open(os.path.join(out, "mine.txt"), "w") as f:
        f.write("not the comparison's")
    compare_resume.check_out_dir(cfg, out, resume=False, overwrite=True)
    assert os.listdir(out) == ["mine.txt"]  # only the comparison's own outputs removed


def test_dashed_fit_shares_its_data_colour_and_pngs_combine(tmp_path):
    from matplotlib.figure import Figure

    from vpo.eval import plots

    fig = Figure()
    ax = fig.add_subplot()
    plots._draw(ax, {"grpo": ([1, 2], [1, 2]), "grpo fit": ([1, 2], [1, 1.5]),
                     "vpo": ([1, 2], [0, 1])}, marker=None, dashed=["grpo fit"])
    data, fit, other = ax.get_lines()
    assert fit.get_linestyle() == "--" and fit.get_color() == data.get_color()
    assert other.get_color() != data.get_color() and other.get_linestyle() == "-"
    a = plots.plot_metric_vs_k(str(tmp_path / "a.png"), {"x": ([1, 2], [0.1, 0.2])})
    b = plots.plot_metrics_over_steps(str(tmp_path / "b.png"), {"e": {"x": ([1, 2], [1, 0])}})
    out = plots.combine_pngs(str(tmp_path / "ab.png"), [[a, b], [b]], title="both")
    assert os.path.getsize(out) > max(os.path.getsize(a), os.path.getsize(b)) / 2
    with pytest.raises(ValueError, match="rows is empty"):
        plots.combine_pngs(str(tmp_path / "none.png"), [[]])


def test_headline_of_a_host_scored_task_without_distinct_counts():
    """Host-scored tasks (arithmetic, your data) count no distinct symbol answers: the headline
    and the report table leave the column out instead of failing."""
    row = {"seed": 0, "m": 1, "best@1": 0.5, "pass@1": 0.0, "diversity": 0.1,
           "valid_fraction": 1.0, "entropy": 0.2}
    head = compare_numbers.headline(make_config("smollm"), {},
                                   {"ks": [1], "rows": {"sft (m=1)": [row]}}, None)
    assert "distinct" not in head["sft (m=1)"]["values"]
    assert head["sft (m=1)"]["values"]["diversity"] == [0.1]


def test_the_pilot_gate_names_what_the_design_cannot_show(tmp_path):
    """A random policy solves nothing: the gate's 'solves' check fails and its sentence names
    the setting; the numbers it returns are what failed_checks reads."""
    cfg = make_config("smoke", ["gate=true", "gate_problems=4"])
    task = load_task(cfg.task, None, cfg.task_kwargs or None)
    _, policy = _saved_tiny_policy(tmp_path, task)
    gate = compare_gate.pilot_gate(cfg, task, policy)
    N = cfg.eval_budget
    assert gate["pass@1"] == 0.0 and gate[f"pass@{N}"] == 0.0
    assert 0.0 <= gate["group_spread"] <= 1.0 and gate["G"] == cfg.sampler.num_samples
    assert gate["checks"]["headroom"] and not gate["checks"]["solves"]
    failed = compare_gate.gate_failures(cfg, gate)
    assert any("gate_pass_min" in f for f in failed)
    roomless = gate | {f"pass@{N}": 0.95, "group_spread": 0.1,
                       "checks": {"headroom": False, "solves": True, "signal": False}}
    text = " ".join(compare_gate.gate_failures(cfg, roomless))
    assert "no headroom" in text and "sampler.num_samples" in text
    # a weighted component that never reaches full marks is named, with the way to say which
    # components define solved
    never = gate | {"full_marks": {"correct": 0.4, "brevity": 0.0}}
    text = " ".join(compare_gate.gate_failures(cfg, never))
    assert "the component(s) brevity never reach full marks" in text and "--solved NAMES" in text
    # a cover task's gate: each target's hit rate, groups with a hit, cover@N in its band
    strict = make_config("smoke", ["gate_hit_min=0.08", "gate_hit_groups_min=0.5",
                                   "gate_cover_min=0.1", "gate_cover_max=0.5"])
    cover = gate | {"hit_rates": {"hit1": 0.12, "hit2": 0.03}, "hit_groups": 0.4,
                    f"cover@{N}": 0.02, "checks": {"headroom": True, "solves": True,
                                                   "signal": True, "hits": False,
                                                   "hit_groups": False, "cover": False}}
    failed = compare_gate.gate_failures(strict, cover)
    assert len(failed) == 3 and "hit1 0.120, hit2 0.030" in failed[0]
    assert "40% of the step-0 groups hold a hit" in failed[1] and "almost never covers" in failed[2]


def test_the_pilot_gate_measures_each_target_on_a_cover_task(tmp_path):
    """On countdown2_1op (cover components: the two targets) the gate reports each target's
    step-0 hit rate, the groups with a hit and cover@N, and checks them."""
    cfg = make_config("smoke", ["task=countdown2_1op", "num_answers=2", "search.members=4",
                                "search.children=4", "gate_problems=4", "gate_hit_min=0.08"])
    task = load_task(cfg.task, None, cfg.task_kwargs or None)
    _, policy = _saved_tiny_policy(tmp_path, task)
    gate = compare_gate.pilot_gate(cfg, task, policy)
    assert set(gate["hit_rates"]) == {"hit1", "hit2"}
    assert all(0.0 <= v <= 1.0 for v in gate["hit_rates"].values())
    assert 0.0 <= gate["hit_groups"] <= 1.0 and f"cover@{cfg.eval_budget}" in gate
    assert gate["checks"]["hits"] == (min(gate["hit_rates"].values()) >= 0.08)


def test_the_diversity_pilot_reads_the_first_seed_of_each_arm_and_reaches_the_report():
    """Seed 0's first fifth of the steps: VPO's mean training diversity against GRPO's for the
    primary claims between two arms (not against the warm start); the report says it as a
    description of one seed."""
    cfg = make_config("default", ["train.steps=10"])
    rows = {"grpo": [{"diversity": d} for d in (0.4, 0.2, 0.9)],
            "vpo": [{"diversity": d} for d in (0.5, 0.6, 0.0)]}
    runs = {arm: [compare_arms.ArmRun(arm, 0, 1, "", None, r, {}, 1.0)] for arm, r in rows.items()}
    pilot = compare_gate.diversity_pilot(cfg, runs)
    assert pilot["steps"] == 2 and pilot["seed"] == cfg.seeds[0]
    assert pilot["diversity"] == pytest.approx({"grpo": 0.3, "vpo": 0.55})
    assert pilot["above"] == {"vpo-grpo": True}  # vpo-warm is not a pair of arms
    gate = {"problems": 4, "pass@1": 0.1, f"pass@{cfg.eval_budget}": 0.3,
            f"best@{cfg.eval_budget}": 0.5, "group_spread": 1.0, "G": 8, "enforced": True,
            "failed": [], "pilot": pilot}
    text = " ".join(compare_render._gate_lines(cfg, gate))
    assert "**Diversity pilot** (seed 0" in text and "grpo 0.300, vpo 0.550" in text
    assert "vpo-grpo: above" in text


def test_the_gate_settings_are_checked():
    with pytest.raises(ConfigError, match="gate_pass_max"):
        make_config("default", ["gate_pass_max=1.5"])
    assert make_config("default").gate and not make_config("smoke").gate
