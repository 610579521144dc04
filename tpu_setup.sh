#!/usr/bin/env bash
# Bootstrap vpo on a Cloud TPU VM, or on every worker of a TPU pod slice. Idempotent: re-running
# reuses the venv and only re-installs what changed.
#
# One TPU VM (v4-8, v5e-8, ...), from the repository root on the VM:
#     bash tpu_setup.sh
#
# Every worker of a pod slice (run from your machine, repository root):
#     gcloud compute tpus tpu-vm scp --recurse . NAME:~/vpo --zone ZONE --worker=all
#     gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all \
#         --command 'cd ~/vpo && bash tpu_setup.sh'
#
# Multi-host training: the SAME command on all workers at once; `--distributed` makes each process
# call jax.distributed.initialize() (on TPU the coordinator and process ids are discovered), the
# mesh spans every chip of the slice, and each host feeds its share of the global batch:
#     gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all --command \
#         'cd ~/vpo && .venv/bin/vpo train --distributed --preset maze objective.advantage=vpo \
#          model=hf:$HOME/ckpt/Qwen3-4B --out $HOME/runs/vpo'
# (copy the checkpoint folder to the same path on every worker first). The paper-scale comparison
# is `vpo compare --preset paper` (settings in vpo/compare/config.py PRESETS["paper"]).
#
# Environment knobs: PYTHON (default python3), VENV (default .venv), JAX_TPU_SPEC (default
# "jax[tpu]", e.g. "jax[tpu]==0.10.2" to pin).
set -euo pipefail

cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
JAX_TPU_SPEC=${JAX_TPU_SPEC:-jax[tpu]}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
# libtpu wheels come from Google's release index; pip skips what is already satisfied.
"$VENV/bin/pip" install -q "$JAX_TPU_SPEC" \
  -f https://storage.googleapis.com/jax-releases/libtpu_releases.html
"$VENV/bin/pip" install -q -e '.[tpu]'

# One-line check: this worker sees its local TPU chips (and, on a slice, the global count after
# jax.distributed.initialize in a multi-host run).
"$VENV/bin/python" - <<'PY'
import jax
d = jax.devices()
print(f"process {jax.process_index()}: {len(d)} devices ({d[0].platform}, {d[0].device_kind}), "
      f"{jax.local_device_count()} local")
assert d[0].platform == "tpu", "no TPU visible: is libtpu installed, and no other process on it?"
PY
echo "vpo ready in $VENV"
