"""Compile the kernels ahead of time for a TPU or an H100 on a machine that has neither.

    python -m vpo.kernels.aot_check --target v5e [--cells lean|full] [--devices 1]

needs `jax[tpu,cuda12-local]==<jax's version>` (libtpu; the CUDA plugin without CUDA itself),
e.g. in .venv-aot made by .ci/run. Prints one JSON line per (kernel, shape) cell: ok or the
error's first line, the kernel custom calls found in `compiled.as_text()`, the compile time
and `memory_analysis()` (argument / output / temp bytes per device). Compiling, unlike
lowering, runs Mosaic's / Triton's own checks (VMEM and shared-memory limits, tile rules); it
checks neither numerics nor speed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

H100 = """gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
TPU_TOPOLOGIES = {"v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}
TARGETS = (*TPU_TOPOLOGIES, "h100")
CUSTOM_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu")

# (kernel, pass, shape, dtype): logprob shape (N, D, V); decode (B, G, Z, H/Z, E, P, C)
LEAN = (
    ("logprob_entropy", "fwd", (72, 896, 151936), "bfloat16"),  # Qwen2.5-0.5B, 72 rows
    ("logprob_entropy", "grad", (72, 896, 151936), "bfloat16"),
    ("decode_attention", "fwd", (1, 4, 8, 2, 128, 200, 32768), "bfloat16"),  # Qwen3-0.6B GQA
)
FULL = LEAN + (
    ("logprob_entropy", "fwd", (2048, 1024, 151936), "bfloat16"),  # Qwen3-0.6B
    ("logprob_entropy", "fwd", (256, 4096, 151936), "float32"),
    ("decode_attention", "fwd", (2, 8, 2, 7, 64, 333, 4096), "bfloat16"),  # Qwen2.5-0.5B
)


def set_up_env():
    """Environment for a device-less build: no CUDA device to open, no version check."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


def target_devices(target: str, n: int = 1):
    """The devices of a TPU slice (4 chips) or of `n` H100s on one host, described, not opened."""
    from jax.experimental import topologies

    if target == "h100":
        return topologies.get_topology_desc(platform="cuda", target_config=H100,
                                            topology=f"1x1x{n}").devices
    return topologies.get_topology_desc(TPU_TOPOLOGIES[target], "tpu").devices


def _cell_fn(kernel: str, pass_: str, shape, dtype, platform: str):
    """(function, abstract arguments, in_specs) of one cell; the kernels get `platform`."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    dt = jnp.dtype(dtype)
    if kernel == "logprob_entropy":
        from vpo.kernels.logprob_entropy import logprob_entropy

        N, D, V = shape
        args = ((N, D), dt), ((D, V), dt), ((N,), jnp.int32)

        def fwd(h, w, t):
            return logprob_entropy(h, w, t, platform=platform)

        if pass_ == "grad":
            def fn(h, w, t):
                return jax.value_and_grad(lambda h, w: sum(x.sum() for x in fwd(h, w, t)),
                                          argnums=(0, 1))(h, w)
        else:
            fn = fwd
        return fn, args, (P("x"), P(), P("x"))  # rows over the mesh
    from vpo.kernels.decode_attention import decode_attention

    B, G, Z, Hn, E, Pl, C = shape
    args = (((B, G, Z, Hn, E), dt), ((B, Z, Pl, E), dt), ((B, Z, Pl, E), dt),
            ((B, Pl), jnp.bool_), ((B, G, Z, C, E), dt), ((B, G, Z, C, E), dt), ((), jnp.int32))

    def fn(*xs):
        return decode_attention(*xs, platform=platform)

    g = P(None, "x")  # samples over the mesh; each device reads the whole prefix
    return fn, args, (g, P(), P(), P(), g, g, P())


def compile_cell(devices, kernel: str, pass_: str, shape, dtype, n_devices: int = 1) -> dict:
    """Compile one cell for `n_devices` of `devices` (rows / batch sharded over them)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from vpo.kernels.hardware import platform_of

    mesh = jax.sharding.Mesh(np.array(devices[:n_devices]), ("x",))
    platform = platform_of(mesh)
    row = {"kernel": kernel, "pass": pass_, "shape": list(shape), "dtype": dtype,
           "devices": n_devices, "platform": platform}
    t0 = time.perf_counter()
    try:
        fn, args, specs = _cell_fn(kernel, pass_, shape, dtype, platform)
        if n_devices > 1:  # one kernel per device on its shard
            out_specs = specs[0] if kernel == "decode_attention" else (specs[0], specs[0])
            fn = jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=out_specs,
                               check_vma=False)
        avals = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, spec))
                 for (s, d), spec in zip(args, specs, strict=True)]
        with jax.set_mesh(mesh):
            compiled = jax.jit(fn).trace(*avals).lower().compile()
        text = compiled.as_text()
        mem = compiled.memory_analysis()
        row.update(ok=True, custom_calls={c: text.count(c) for c in CUSTOM_CALLS
                                          if c in text},
                   memory={k: int(getattr(mem, f"{k}_size_in_bytes")) for k in
                           ("argument", "output", "temp", "alias")} if mem else None)
    except Exception as e:  # noqa: BLE001 — a failing cell is a result here
        lines = [x for x in str(e).splitlines() if x.strip()]
        row.update(ok=False, error=f"{type(e).__name__}: {lines[0][:300] if lines else ''}")
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, required=True)
    parser.add_argument("--cells", choices=("lean", "full"), default="lean")
    parser.add_argument("--devices", type=int, default=1,
                        help="devices of the target to shard the forward cells over")
    args = parser.parse_args(argv)
    set_up_env()
    devices = target_devices(args.target, args.devices)
    failed = 0
    for cell in (LEAN if args.cells == "lean" else FULL):
        if args.devices > 1 and cell[1] != "fwd":
            continue  # sharded builds: the forward kernels
        row = compile_cell(devices, *cell, n_devices=args.devices)
        row["target"] = args.target
        failed += not row["ok"]
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
