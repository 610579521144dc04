"""`vpo plan`'s search programs (`vpo.accel.build`) on this host's CPU at tiny shapes: the
island search that learns (`search_learn`: `vpo.search.learn.learning_program`, every
generation and its update in one scan) builds and compiles with LoRA adapters of
learn.lora_rank on a policy without them, or trains every weight at rank 0; the `search.*` /
`learn.*` settings reach both search programs; vpo at m = 1 is refused as a setting; a
host-scored task's searches are reported not applicable, never built. The H100 / TPU v5e
builds are `vpo plan --target` in .venv-aot's interpreter (docs/search_learn.md)."""

import jax
import pytest

from vpo.accel import build as build_lib
from vpo.accel import program_report
from vpo.config import ConfigError
from vpo.launch.assemble import assemble_run
from vpo.model import sharding

TINY = build_lib.SearchSettings(("search.islands=2", "search.members=2", "search.parents=1",
                                 "search.children=2", "search.generations=2",
                                 "search.num_answers=1", "learn.lora_rank=2"), problems=2)


@pytest.fixture(scope="module")
def codeword():
    a = assemble_run(None, None, ["task=codeword", "model=tiny"])
    return a.run, a.task, sharding.make_mesh(devices=jax.devices()[:1])


def test_the_learning_search_compiles_with_memory(codeword):
    run, task, mesh = codeword
    assert run.model.lora_rank == 0
    (built,) = build_lib.build("search_learn", run, task, mesh, TINY)
    assert built.error is None, built.error
    report = program_report.from_built(built, "cpu", 2**30)
    assert report.ok and report.fits, report
    # arguments: the adapters, the base, 2 problems, the key and the rate; outputs: the final
    # state (adapters and Adam's moments), the trace and the update's metrics
    assert report.argument_bytes > 0 and report.output_bytes > 0 and report.temp_bytes > 0


def test_the_learning_search_trains_adapters_or_every_weight(codeword):
    run, task, mesh = codeword
    (lora,) = build_lib.make_programs("search_learn", run, task, mesh, TINY)
    full_settings = build_lib.SearchSettings((*TINY.overrides, "learn.lora_rank=0"), 2)
    (full,) = build_lib.make_programs("search_learn", run, task, mesh, full_settings)
    params, frozen, problems, key, rate = lora.args
    assert frozen is not None and full.args[1] is None  # LoRA: the base weights apart
    n = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    assert n(params) < n(full.args[0]) == n(frozen)
    assert jax.tree.leaves(problems)[0].shape[0] == 2 and key.shape == (2,) and rate.shape == ()


def test_search_settings_reach_the_search_programs(codeword):
    run, task, mesh = codeword
    cfg, learn = build_lib.search_configs(run, mesh, TINY)
    assert (cfg.islands, cfg.members, cfg.children, cfg.generations) == (2, 2, 2, 2)
    assert learn.objective == "grpo" and learn.lora_rank == 2
    cfg, learn = build_lib.search_configs(run, mesh)  # the defaults: 4 islands, m of the run
    m = run.train.num_answers
    assert (cfg.islands, cfg.num_answers, cfg.children) == (4, m, 4 * m)
    assert learn.objective == "grpo"
    (search,) = build_lib.make_programs("search", run, task, mesh, TINY)
    assert jax.tree.leaves(search.args[2])[0].shape[0] == 2
    with pytest.raises(ConfigError, match="search.islandz"):
        build_lib.search_configs(run, mesh, build_lib.SearchSettings(("search.islandz=2",)))


def test_vpo_at_one_answer_is_a_refused_setting(codeword):
    run, task, mesh = codeword
    settings = build_lib.SearchSettings((*TINY.overrides, "learn.objective=vpo"), 2)
    (built,) = build_lib.build("search_learn", run, task, mesh, settings)
    report = program_report.from_built(built, "cpu", 2**30)
    assert built.stage == "build" and report.error_name == program_report.SETTING, report
    assert "search.num_answers >= 2" in report.error


def test_a_host_scored_task_has_no_search_programs(monkeypatch):
    """Both searches of a host-scored task (arithmetic) are rows saying why, not builds."""
    from vpo.accel import targets

    a = assemble_run("arithmetic", None, ["model=tiny"])
    monkeypatch.setattr(targets, "mesh", lambda *_, **__: sharding.make_mesh(
        devices=jax.devices()[:1]))
    monkeypatch.setattr(build_lib, "build", lambda *a, **k: pytest.fail("built"))
    reports = program_report.plan(a.run, a.task, "h100", ("search", "search_learn"), search=TINY)
    assert [r.program for r in reports] == ["search", "search_learn"]
    for r in reports:
        assert not r.applicable and r.error_name == program_report.NOT_APPLICABLE, r
        assert "scores on the host" in r.error and r.change is None
