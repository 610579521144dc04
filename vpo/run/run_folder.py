"""A run folder and who may write it: its layout (`RUN_FILES`), one process at a time
(`lock_run`: an exclusive lock on `<out>/.vpo.lock`, the holder's pid named to anyone refused),
new runs that never overwrite (`check_new_run`, `clear_run`), the config a resumed run reads
back with only the overrides that keep it the same run (`resume_config`), the hash of its
--data file (`record_data`, `check_data`), and complete policy exports (`policy_complete`).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import socket

from vpo.config import ConfigError, RunConfig, apply_overrides, from_dict
from vpo.errors import CheckpointError

CONFIG = "config.json"
# What a run writes into its folder (`train`), besides an empty `checkpoints/` made on start.
DATA_FILE = "data.json"  # the hash of the run's --data file, checked by --resume
RUN_FILES = (CONFIG, "init.json", "metrics.jsonl", "samples.jsonl", "checkpoints", "policy", "tb",
             "tokenizer.json", "tokenizer_config.json", "generation_config.json",
             "chat_template.jinja", DATA_FILE)
# Overrides that `--resume` applies: they change when the run stops, saves and logs, never what
# a step computes. Everything else would make the resumed run a different run.
RESUME_SAFE = ("train.steps", "train.checkpoint_every", "train.keep_checkpoints",
               "train.log_every", "train.profile_every", "train.sample_every",
               "train.max_skipped_updates")

LOCK_FILE = ".vpo.lock"
_HELD: dict[str, tuple[int, bool]] = {}  # run folder → (locked fd, whether lock_run made it)


class RunFolderLockedError(ConfigError):
    """Another process holds the run folder's lock (`lock_run`)."""


def _lead_process() -> bool:
    """Process 0 of a multi-process run (the one that locks its run folder), without starting
    the JAX backend when `jax.distributed` is not in use (jax is imported here, on first use:
    the command line reads and locks folders before anything needs it)."""
    import jax

    return not jax.distributed.is_initialized() or jax.process_index() == 0


def _holder(fd: int) -> str:
    """'pid N on HOST since T' as the lock file says, or a note that it does not say."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its pid yet"


def _try_lock(path: str) -> int:
    """An fd holding an exclusive flock on `path` (created if missing), or RunFolderLockedError."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunFolderLockedError(holder) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file as it let go: lock the one now there


def lock_run(out_dir: str, *, flag: str = "--out") -> bool:
    """Take the exclusive lock on run folder `out_dir` (created if missing) for this process:
    `<out_dir>/.vpo.lock`, an flock holding this process's pid and host. Returns whether it was
    taken now (False: this process already holds it, or is not process 0 of a multi-process
    run). Another live holder is a `RunFolderLockedError` naming its pid; the lock of a killed
    process is free (the kernel lets go of it), so it is taken over."""
    key = os.path.realpath(out_dir)
    if key in _HELD or not _lead_process():
        return False
    made = not os.path.isdir(key)
    os.makedirs(key, exist_ok=True)
    try:
        fd = _try_lock(os.path.join(key, LOCK_FILE))
    except RunFolderLockedError as e:
        raise RunFolderLockedError(f"{flag} {out_dir}: another vpo process ({e}) is using this run "
                            "folder; wait for it to finish, stop it, or pick another folder"
                            ) from None
    os.ftruncate(fd, 0)
    since = datetime.datetime.now().isoformat(timespec="seconds")
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                              "since": since}).encode(), 0)
    _HELD[key] = (fd, made)
    return True


def release_run(out_dir: str) -> None:
    """Let go of the lock `lock_run` took on `out_dir` (no-op if not held): the lock file is
    removed, and the folder too if `lock_run` made it and it is still empty."""
    key = os.path.realpath(out_dir)
    fd, made = _HELD.pop(key, (None, False))
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(key, LOCK_FILE))
    os.close(fd)
    if made:
        with contextlib.suppress(OSError):  # it holds something now
            os.rmdir(key)


def release_locks() -> None:
    """Let go of every run folder lock this process holds (for a caller that ends early)."""
    for key in list(_HELD):
        release_run(key)


def run_contents(out_dir: str) -> list[str]:
    """The run artefacts in `out_dir` (`RUN_FILES`, and `policy.json` of a policy folder); empty
    for a new or empty folder, or one holding only an empty `checkpoints/`."""
    if not os.path.isdir(out_dir):
        return []
    found = [n for n in (*RUN_FILES, "policy.json") if os.path.exists(os.path.join(out_dir, n))]
    ckpt = os.path.join(out_dir, "checkpoints")
    if "checkpoints" in found and os.path.isdir(ckpt) and not os.listdir(ckpt):
        found.remove("checkpoints")
    return found


def has_checkpoint(out_dir: str) -> bool:
    """Whether `out_dir/checkpoints` holds a step folder (orbax names them by step)."""
    ckpt = os.path.join(out_dir, "checkpoints")
    return os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))


def check_new_run(out_dir: str, *, overwrite: bool = False, flag: str = "--out") -> None:
    """Raise unless `out_dir` can take a new run: not a file, not in use by another process
    (`lock_run`: the lock is taken first and kept for the run, which `train` lets go of), and
    holding no run unless `overwrite` (which `clear_run` then acts on, after the new config has
    validated)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"{flag} {out_dir}: is a file, not a folder; pick a folder path")
    taken = lock_run(out_dir, flag=flag)
    found = run_contents(out_dir)
    if found and not overwrite:
        if taken:
            release_run(out_dir)
        raise ConfigError(f"{flag} {out_dir}: already holds a run ({', '.join(found)}); continue "
                          "it with --resume, pick a new folder, or pass --overwrite to replace it")


def clear_run(out_dir: str) -> None:
    """Delete the run artefacts (`RUN_FILES`, an unfinished policy export) in `out_dir`, under
    its lock (`lock_run`, kept for the run); other files are left alone."""
    import shutil

    lock_run(out_dir)
    for name in (*RUN_FILES, "policy.json", POLICY_PARTIAL):
        path = os.path.join(out_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def discard_start(out_dir: str) -> None:
    """Remove what a new run's start wrote into `out_dir` (`clear_run`: its init.json, config,
    tokenizer, data hash, empty logs and checkpoint folder) when it failed before its first step:
    there is nothing to resume, and the corrected command then starts in the same --out without
    --overwrite. Process 0 only (the one that wrote them)."""
    if _lead_process():
        clear_run(out_dir)


def read_run_config(out_dir: str, *, flag: str = "--resume") -> RunConfig:
    """The RunConfig saved in `out_dir/config.json`; a missing folder, a folder with no run or
    an unreadable file is a named error."""
    path = os.path.join(out_dir, CONFIG)
    if not os.path.isdir(out_dir):
        raise ConfigError(f"{flag}: there is no run folder {out_dir}; check the --out path, or "
                          "start a new run there without --resume")
    if not os.path.isfile(path):
        raise ConfigError(f"{flag}: {out_dir} holds no run to resume (no {CONFIG}); start a new "
                          "run there without --resume")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f"{path}:{e.lineno}" if isinstance(e, json.JSONDecodeError) else path
        raise CheckpointError(f"{where}: the run's config is not valid JSON ({e}); restore it "
                              "from the newest checkpoint's config/ or start a new run") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object (a RunConfig), got "
                              f"{type(data).__name__}")
    return from_dict(RunConfig, data)


def resume_config(out_dir: str, overrides: list[str], *, data_changed_ok: bool = False
                  ) -> RunConfig:
    """The saved run config of `out_dir` with the `RESUME_SAFE` overrides applied; any other
    override is rejected by name (it would make the resumed run a different run). A folder in
    use by another process is a `RunFolderLockedError`; a --data file that changed since the run
    started is a `ConfigError` unless `data_changed_ok` (then the new file is recorded)."""
    if os.path.isdir(out_dir) and lock_run(out_dir, flag="--resume"):
        release_run(out_dir)  # free now; `train` takes it for the run
    run = read_run_config(out_dir)
    check_data(out_dir, run, changed_ok=data_changed_ok)
    for item in overrides:
        key = item.partition("=")[0]
        if key not in RESUME_SAFE:
            raise ConfigError(f"{key}: cannot change on --resume (the run in {out_dir} would no "
                              f"longer be the run it was); --resume applies only "
                              f"{', '.join(RESUME_SAFE)}. To change {key}, start a new run: "
                              f"--config {os.path.join(out_dir, CONFIG)} {item} --out NEW_DIR"
                              + _init_hint(out_dir))
    new = apply_overrides(run, overrides)
    if new.train.steps != run.train.steps and new.train.schedule != "constant":
        raise ConfigError(f"train.steps: the {new.train.schedule} learning-rate schedule spans "
                          f"train.steps ({run.train.steps}), so changing it to "
                          f"{new.train.steps} would change the learning rate of steps already "
                          "taken; resume without it, or start a new run with --config "
                          f"{os.path.join(out_dir, CONFIG)} train.steps={new.train.steps}")
    return new


POLICY_PARTIAL = ".policy.partial"  # `save_policy`'s temporary folder for out_dir/policy
INIT_FILE = "init.json"  # a run's starting policy (`--init` / `model=hf:`), read by --resume


def init_spec_of(spec: str) -> str:
    """How a run folder records its starting policy: `hf:PATH` as given, a policy folder as an
    absolute path (a resumed run may start from another working directory)."""
    return spec if spec.startswith("hf:") else os.path.abspath(spec)


def write_init(out_dir: str, spec: str) -> None:
    """Record the policy a run starts from (`--init` / `model=hf:`) in `out_dir/init.json`."""
    os.makedirs(out_dir, exist_ok=True)
    write_json_atomic(os.path.join(out_dir, INIT_FILE), {"init": init_spec_of(spec)})


def read_init(out_dir: str) -> str | None:
    """The starting policy `write_init` recorded in `out_dir`, or None (a random init, or no
    readable record)."""
    info = read_json(os.path.join(out_dir, INIT_FILE))
    init = info.get("init") if isinstance(info, dict) else None
    return init if isinstance(init, str) else None


def _init_hint(out_dir: str) -> str:
    """The `--init` a new run needs to start where `out_dir` started (its init.json), or ''."""
    init = read_init(out_dir)
    return f" --init {init} (the policy this run started from)" if init else ""


def base_spec(out_dir: str, config: RunConfig) -> str:
    """What the run's base weights are (named by a LoRA checkpoint, which does not hold them):
    its starting policy (`INIT_FILE`), else the random init of config.model at train.seed."""
    return read_init(out_dir) or (
        f"the random init of the run's model config (train.seed={config.train.seed})")


def base_name(out_dir: str) -> str | None:
    """The base model as a path for other tools (PEFT's base_model_name_or_path): the run's
    starting policy (`INIT_FILE`) without its `hf:` prefix, or None (a random init)."""
    init = read_init(out_dir)
    return init.removeprefix("hf:") if init else None


def data_path(config: RunConfig) -> str | None:
    """The run's data file (task_kwargs `path`, e.g. `--data FILE`), or None."""
    path = (config.task_kwargs or {}).get("path")
    return path if isinstance(path, str) and path else None


def file_digest(path: str) -> dict:
    """{"path", "sha256", "bytes"} of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": path, "sha256": h.hexdigest(), "bytes": os.path.getsize(path)}


def record_data(out_dir: str, config: RunConfig) -> None:
    """Write `out_dir/data.json`: the hash of the run's data file (none: nothing written)."""
    path = data_path(config)
    if path is not None and os.path.isfile(path):
        write_json_atomic(os.path.join(out_dir, DATA_FILE), file_digest(path))


def check_data(out_dir: str, config: RunConfig, *, changed_ok: bool = False) -> None:
    """Raise `ConfigError` if the run's data file differs from the one its run started on
    (`out_dir/data.json`); `changed_ok` records the new file instead. A run without data.json
    (no data file, or written by an older vpo) is not checked."""
    recorded = read_json(os.path.join(out_dir, DATA_FILE))
    path = data_path(config)
    if not isinstance(recorded, dict) or path is None:
        return
    if not os.path.isfile(path):
        raise ConfigError(f"--resume: the run's data file {path} is gone; put it back (sha256 "
                          f"{recorded.get('sha256')}), or start a new run on another file")
    now = file_digest(path)
    if now["sha256"] == recorded.get("sha256"):
        return
    if not changed_ok:
        raise ConfigError(f"--resume: the run's data file {path} changed since the run started "
                          f"({recorded.get('bytes')} bytes, sha256 {recorded.get('sha256')}; now "
                          f"{now['bytes']} bytes, sha256 {now['sha256']}), so the resumed steps "
                          "would not continue the same run; restore the file, start a new run "
                          "on it, or resume on the new file on purpose with data_changed_ok "
                          "(`resume_config(..., data_changed_ok=True)`)")
    write_json_atomic(os.path.join(out_dir, DATA_FILE), now)


def write_json_atomic(path: str, data) -> None:
    """Write JSON through a temporary file and a rename: a killed process leaves the old file or
    the new one, never half of one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def policy_complete(policy_dir: str) -> bool:
    """A policy folder `policy_folder.save_policy` finished: policy.json (written last) and every
    file it lists under "files" (an older export without the list: its tokenizer files)."""
    info = read_json(os.path.join(policy_dir, "policy.json"))
    if not isinstance(info, dict):
        return False
    files = info.get("files")
    if not isinstance(files, list):
        files = ["params", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]
    return all(isinstance(n, str) and os.path.exists(os.path.join(policy_dir, n))
               for n in files)


def read_json(path: str):
    """A JSON file's value, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
