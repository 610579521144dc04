"""What a checkpoint failure says: orbax's and tensorstore's errors read down to one line (which
array, what is wrong with its file; a write that failed on the disk), and their background noise
kept off the terminal. `vpo.io.run_checkpoint` and `vpo.io.policy_folder` raise the named errors
built from these.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

import jax


def _closed_loop_noise(unraisable) -> bool:
    """Whether an unraisable exception is noise after a failed read or write, which is raised
    as a named error: tensorstore calling back into the asyncio loop orbax closed, or one of
    orbax's own reads still in flight (one per array, each with pages of tensorstore spec)."""
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
        return True
    tb = getattr(e, "__traceback__", None)
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    return f"{os.sep}orbax{os.sep}checkpoint{os.sep}" in where


def quiet_failed_reads() -> None:
    """Drop `_closed_loop_noise` from `sys.unraisablehook` (installed once, for the process;
    every other unraisable exception still reaches the previous hook), and orbax's own error
    logs (`_quiet_orbax_errors`)."""
    import sys
    import warnings

    _quiet_orbax_errors()
    # a failed write leaves orbax's per-array write coroutines unawaited at exit
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message=r"coroutine 'async_serialize_from_host\..*' was never awaited")
    previous = sys.unraisablehook
    if getattr(previous, "_vpo_quiet", False):
        return

    def hook(unraisable):
        if not _closed_loop_noise(unraisable):
            previous(unraisable)

    hook._vpo_quiet = True
    sys.unraisablehook = hook


def _from_orbax(e: BaseException | None) -> bool:
    """Whether `e` was raised in orbax's code or carries tensorstore's spec (its reads and
    writes)."""
    tb = getattr(e, "__traceback__", None)
    while tb is not None:
        if f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    text = str(e)
    return any(mark in text for mark in ("tensorstore_spec", "OCDBT database",
                                         ".orbax-checkpoint-tmp"))


def _quiet_orbax_errors() -> None:
    """Drop orbax's own ERROR log records (each with a traceback of tensorstore text) from the
    terminal, and asyncio's "exception was never retrieved" for orbax's reads and writes left
    in flight by a failure: every failure they report is raised as a named error
    (`CheckpointWriteError`, `CheckpointError`) with orbax's exception behind it.
    `VPO_DEBUG=1` keeps them. Installed once, on the `absl` logger orbax logs through and on
    the `asyncio` logger."""
    def keep(record: logging.LogRecord) -> bool:
        if os.environ.get("VPO_DEBUG", "") not in ("", "0") or record.levelno < logging.ERROR:
            return True
        if f"{os.sep}orbax{os.sep}" in (record.pathname or ""):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if record.name != "asyncio":
            return True
        # "Future exception was never retrieved": the exception on the record, or only in its
        # text (a future failed by tensorstore carries no traceback into orbax)
        return not (_from_orbax(exc) or _from_orbax(Exception(record.getMessage())))

    keep._vpo_quiet = True
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(getattr(f, "_vpo_quiet", False) for f in logger.filters):
            logger.addFilter(keep)


def write_failure(e: BaseException) -> tuple[str, str] | None:
    """(what went wrong, what to do) when `e`, or an error it was raised from, is a write that
    failed on the disk: no space left (tensorstore's RESOURCE_EXHAUSTED, errno 28), no
    permission, a read-only disk, another I/O error; None for any other error."""
    seen: BaseException | None = e
    for _ in range(8):  # the chain of causes, bounded
        if seen is None:
            break
        text, code = str(seen), getattr(seen, "errno", None)
        if (code == errno.ENOSPC or code == errno.EDQUOT or "No space left" in text
                or "os_error_code='28'" in text or "RESOURCE_EXHAUSTED" in text
                or "quota exceeded" in text.lower()):
            return "no space left on the disk", "free space on that disk"
        if (code in (errno.EACCES, errno.EPERM, errno.EROFS) or "PERMISSION_DENIED" in text
                or "Permission denied" in text or "Read-only file system" in text):
            return "permission denied", "make the folder writable"
        if isinstance(seen, OSError) or "Error writing" in text:
            detail = " ".join(text.split())
            return (f"I/O error: {detail[:120]}{' [...]' if len(detail) > 120 else ''}",
                    "check the disk")
        seen = seen.__cause__ or seen.__context__
    return None


def _one_line(e: BaseException, limit: int) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + " [...]"


def _named_leaves(tree) -> list[tuple[str, Any]]:
    """(dotted path, leaf) of a pytree, with dict keys, attributes and indices alike
    ("params.embed.value", "opt_state.1.0.mu.embed.value"), so a saved tree's metadata and the
    state restored onto name their arrays the same way."""
    def part(key) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)

    return [(".".join(part(k) for k in path), leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _why_not(e: BaseException) -> str:
    """A few words on why orbax did not restore a step: the array and what is wrong with its
    file, read from tensorstore's text (pages of spec and driver errors), or its first words."""
    import re

    text = " ".join(str(e).split())
    shape = re.search(r"Requested shape: \(([^)]*)\) is not compatible with the stored shape: "
                      r"\(([^)]*)\)", text)
    if shape:
        return f"an array ({shape[2]}) saved, ({shape[1]}) now"
    array = re.search(r'Error reading "([^"]+)"', text)
    name = array[1].rsplit("/", 1)[0] if array and "/" in array[1] else (array[1] if array
                                                                      else None)
    what = ("file truncated" if re.search(r"OUT_OF_RANGE|DATA_LOSS|[Tt]runcat|byte range",
                                          text) else
            "file missing" if re.search(r"NOT_FOUND|No such file", text) or isinstance(
                e, FileNotFoundError) else None)
    if what:
        return f"{name}: {what}" if name else what
    return _one_line(e, 80)


def _steps(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))


def _reasons(errors) -> str:
    """'steps 6, 4: rng: file truncated' for (step, reason, ...) tuples, steps with one reason
    named together."""
    by_reason: dict[str, list[int]] = {}
    for s, reason, *_ in errors:
        by_reason.setdefault(reason, []).append(s)
    return "; ".join(f"{_steps(steps)}: {reason}" for reason, steps in by_reason.items())
