"""One error boundary for reading files that may be damaged: whatever a parser raises becomes a
`CheckpointError` naming the file, what is wrong with it and how to fix it."""

from __future__ import annotations

import contextlib
import json

from vpo.errors import CheckpointError, ConfigError


@contextlib.contextmanager
def reading(path, what: str, fix: str):
    """Raise `CheckpointError("<path>: <what> (<error>); <fix>")` for any error raised inside
    but a `CheckpointError` or `ConfigError` (already named) or an `OSError` (names its file)."""
    try:
        yield
    except (CheckpointError, ConfigError, OSError):
        raise
    except Exception as e:  # noqa: BLE001 -- parsers raise anything on a damaged file
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise CheckpointError(f"{path}: {what} ({type(e).__name__}: {detail}); {fix}") from None


def read_json_object(path, fix: str) -> dict:
    """The JSON object in `path`; invalid JSON or another JSON type is a `CheckpointError`
    naming the file (and line)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column "
                              f"{e.colno}; the file may be truncated); {fix}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got a {type(data).__name__}; "
                              f"{fix}")
    return data


def free_space(path) -> str:
    """The free space of the disk holding `path` (or its nearest existing parent), e.g.
    '0 B' or '1.5 GB'; '?' when it cannot be read."""
    import os
    import shutil

    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        free = float(shutil.disk_usage(path).free)
    except OSError:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if free < 1024 or unit == "TB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "?"
