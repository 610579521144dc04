"""Multi-host for real: two processes × 4 CPU devices (`jax.distributed` on 127.0.0.1, gloo CPU
collectives) train the smoke preset on one 8-device mesh and match one process with 8 devices.

Each process feeds its own contiguous slice of every global batch (grain, by process index);
params are sharded over the tensor axis inside each process and the gradients are reduced over
the data axis across the two processes. Metrics, checkpoints and the final policy come out of
the same `vpo.run.loop.train` a single process runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from vpo.io import policy_folder
from vpo.launch import assemble

# the entropy bonus gives every step a gradient to all-reduce, whatever the rewards
from vpo.model import sharding
from vpo.run import loop as loop_lib

OVERRIDES = ["train.steps=3", "train.checkpoint_every=2", "train.profile_every=2",
             "objective.advantage=vpo", "objective.entropy_coef=0.01"]
MESH = dict(data=2, tensor=4)

WORKER = textwrap.dedent("""
    import os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    pid, port, out, overrides = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    from vpo.model import sharding
    sharding.initialize_distributed(sharding.DistributedConfig(
        enabled=True, coordinator="127.0.0.1:" + port, num_processes=2, process_id=pid))
    import jax
    assert jax.process_count() == 2 and jax.device_count() == 8, jax.devices()
    from vpo.run import loop
    from vpo.launch import assemble
    plan = assemble.assemble_run("smoke", None, overrides)
    run, task = plan.run, plan.task
    loop.train(run, out, task=task, mesh=sharding.make_mesh(data=2, tensor=4), progress=False)
    print("worker", pid, "done", flush=True)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.slow
def test_two_processes_match_one_process_of_8_devices(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    port = str(free_port())
    out2 = tmp_path / "two"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(pid), port, str(out2),
                               *OVERRIDES], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for pid in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=420)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]

    # the reference: this process, 8 devices, the same mesh shape and config
    plan = assemble.assemble_run("smoke", None, OVERRIDES)
    run, task = plan.run, plan.task
    out1 = tmp_path / "one"
    _, state1 = loop_lib.train(run, str(out1), task=task, mesh=sharding.make_mesh(**MESH),
                               progress=False)

    r2, r1 = rows(out2 / "metrics.jsonl"), rows(out1 / "metrics.jsonl")
    assert [r["step"] for r in r2] == [r["step"] for r in r1] == [1, 2, 3]
    assert "sampling_time_s" in r2[1]
    # the last step's sample log: process 0 logs the first prompt of its part of the batch
    assert {r["step"] for r in rows(out2 / "samples.jsonl")} == {3}
    timing = {"step_time_s", "tokens_per_s", "sampling_time_s", "update_time_s"}
    for a, b in zip(r2, r1, strict=True):
        for k in sorted(set(b) - timing):
            # same samples and rewards; float reductions may cross processes in another order
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5, err_msg=k)
        assert a["reward"] == b["reward"] and a["generated_tokens"] == b["generated_tokens"]
    # the two-process run's final policy and last checkpoint equal the one-process params
    model, info = policy_folder.load_policy(str(out2 / "policy"))
    assert info["steps"] == 3
    from flax import nnx

    got = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    want = [np.asarray(x) for x in jax.tree.leaves(state1.params)]
    for a, b in zip(got, want, strict=True):  # tolerance as in test_mesh_of_8_devices_matches_one
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-5)
    assert sorted(os.listdir(out2 / "checkpoints")) == ["2", "3"]
