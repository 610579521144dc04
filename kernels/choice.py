"""Which path runs by default on each platform: a kernel only where it was measured faster.

`measured.json` (beside this module) holds rows of kernel-against-XLA timings: per kernel, use
("forward"; "backward" = the gradient pass, forward and backward together), platform, device
and shape, the speedups xla_s / kernel_s measured at one or more points (e.g. the decode
lengths 1, 129 and the full cache). `experiments/device_check.py` writes a refreshed copy of the
table from its kernel cells (`rows_from_cells`, `merge_rows`); committing it changes the
defaults.

The rule (`default_impl`): "auto" takes the Pallas kernel for (kernel, platform, use) only when
the platform compiles it (`hardware.pallas_supported`) and the measured row that covers the
call wins at every point (every speedup > 1); no row, a loss anywhere, or a platform without
Pallas: the XLA path. For decode attention the covering row is the one with the fewest keys
(prefix + cache) at or above the call's, else the longest measured: a kernel measured to win
at 768 keys and lose at 4,608 is the default only up to 768. A kernel slower than XLA is never
the default; an explicit "pallas" or "xla" is always taken as given.
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Iterable, Sequence

from vpo.kernels import hardware

TABLE_PATH = pathlib.Path(__file__).with_name("measured.json")
KERNELS = ("decode_attention", "logprob_entropy")
USES = ("forward", "backward")
CHOICES = ("auto", "pallas", "xla")
_ROW_KEYS = ("kernel", "use", "platform", "device", "shape", "speedups", "measured_at")


def check_row(row: dict, where: str = "kernel table") -> dict:
    """`row` if it is a well-formed table row, else ValueError naming the field."""
    missing = [k for k in _ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"{where}: a row lacks {missing}: {row}")
    if row["kernel"] not in KERNELS or row["use"] not in USES:
        raise ValueError(f"{where}: kernel must be one of {KERNELS} and use one of {USES}; "
                         f"got {row['kernel']!r}, {row['use']!r}")
    if hardware.resolve_platform(row["platform"]) != row["platform"]:
        raise ValueError(f"{where}: platform {row['platform']!r} is not normalised")
    speedups = row["speedups"]
    if not speedups or not all(isinstance(s, (int, float)) and s > 0 for s in speedups):
        raise ValueError(f"{where}: speedups must be positive numbers, got {speedups}")
    if row["kernel"] == "decode_attention" and "keys" not in row:
        raise ValueError(f"{where}: a decode_attention row needs keys (prefix + cache)")
    return row


def load_table(path: str | pathlib.Path = TABLE_PATH) -> tuple[dict, ...]:
    """The rows of a table file, each checked."""
    rows = json.loads(pathlib.Path(path).read_text())["rows"]
    return tuple(check_row(r, str(path)) for r in rows)


@functools.cache
def committed_table() -> tuple[dict, ...]:
    return load_table(TABLE_PATH)


def _covering(rows: Sequence[dict], keys: int | None) -> list[dict]:
    """The rows that judge a call with `keys` keys (all rows when keys is None or absent)."""
    if keys is None or not rows or any("keys" not in r for r in rows):
        return list(rows)
    above = [r for r in rows if r["keys"] >= keys]
    edge = min(r["keys"] for r in above) if above else max(r["keys"] for r in rows)
    return [r for r in rows if r["keys"] == edge]


def kernel_wins(kernel: str, platform: str, use: str = "forward", *, keys: int | None = None,
                table: Iterable[dict] | None = None) -> bool:
    """Whether the table shows `kernel` faster than XLA for `use` on `platform` at every
    measured point of the rows covering a call with `keys` keys (False when unmeasured)."""
    platform = hardware.resolve_platform(platform)
    table = committed_table() if table is None else tuple(table)
    rows = [r for r in table
            if (r["kernel"], r["use"], r["platform"]) == (kernel, use, platform)]
    judged = _covering(rows, keys)
    return bool(judged) and all(min(r["speedups"]) > 1.0 for r in judged)


def default_impl(kernel: str, platform: str | None, choice: str = "auto", *,
                 use: str = "forward", keys: int | None = None,
                 table: Iterable[dict] | None = None) -> str:
    """"pallas" or "xla" for one call: `choice` "pallas" / "xla" as given; "auto" the kernel
    only where it compiles and `kernel_wins`."""
    if choice not in CHOICES:
        raise ValueError(f"kernel choice {choice!r}: expected one of {CHOICES}")
    if choice != "auto":
        return choice
    platform = hardware.resolve_platform(platform)
    if not hardware.pallas_supported(platform):
        return "xla"
    return "pallas" if kernel_wins(kernel, platform, use, keys=keys, table=table) else "xla"


# -- refreshing the table from a device run --------------------------------------------------

def _identity(row: dict) -> tuple:
    return (row["kernel"], row["use"], row["platform"], row["device"],
            json.dumps(row["shape"], sort_keys=True))


def merge_rows(old: Iterable[dict], new: Iterable[dict]) -> list[dict]:
    """`old` with every row of `new` replacing the row of the same kernel, use, platform,
    device and shape (or added), in a stable order."""
    merged = {_identity(r): r for r in old}
    merged.update({_identity(check_row(r)): r for r in new})
    return sorted(merged.values(), key=_identity)


def rows_from_cells(cells: Iterable[dict], *, platform: str, device: str, measured_at: str,
                    jax_version: str) -> list[dict]:
    """Table rows from the kernel cells of `experiments/device_check.py` (one speedup each;
    decode cells carry their keys). Cells timed in interpret mode measure nothing about a
    kernel and are refused; skipped cells and cells without a kernel time are left out."""
    platform = hardware.resolve_platform(platform)
    if platform == "cpu":
        raise ValueError("kernel cells from a CPU run time the interpreter, not a kernel: "
                         "refresh the table from a GPU or TPU run")
    rows = []
    for c in cells:
        if "kernel_s" not in c or not c.get("xla_s"):
            continue
        row = dict(kernel=c["kernel"], use=c["direction"], platform=platform, device=device,
                   shape=c["shape"], speedups=[c["xla_s"] / c["kernel_s"]],
                   measured_at=measured_at, jax=jax_version)
        if c["kernel"] == "decode_attention":
            row["keys"] = int(c["shape"]["P"]) + int(c["shape"]["C"])
        rows.append(check_row(row))
    return rows


def write_table(rows: Sequence[dict], path: str | pathlib.Path) -> None:
    pathlib.Path(path).write_text(json.dumps({"rows": list(rows)}, indent=1) + "\n")
