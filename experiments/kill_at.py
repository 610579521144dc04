"""`vpo` with the kill soak's fault injection: run any `vpo` command line, and when
`VPO_KILL_AT=point:step` names one of the training loop's points (`vpo.run.loop.EVENTS`), send
this process `VPO_KILL_SIGNAL` (KILL, INT or TERM; default KILL) as the loop passes it.

    VPO_KILL_AT=logged:2 VPO_KILL_SIGNAL=INT python experiments/kill_at.py train --out D

`VPO_FILL_AT=point:step` fills the disk instead: a file `VPO_FILL_FILE` takes all the free space
of the disk it is on but `VPO_FILL_LEAVE` bytes (default 0) as the loop passes that point (use
a small disk of its own, e.g. a tmpfs: tests/run/test_faults.py); deleting the file frees it.

    VPO_FILL_AT=logged:3 VPO_FILL_FILE=/mnt/small/ballast python experiments/kill_at.py train ...

The library loop only reports its points (`train(on_event=...)`); the faults live here.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys

from vpo.cli import main as cli
from vpo.run import loop


def fill_disk(path: str, leave: int = 0) -> int:
    """Write `path` until its disk is full, then give back `leave` bytes of it → its size."""
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):  # the last bytes in smaller writes
            try:
                while True:
                    f.write(block[:size])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        size = f.tell()
        f.truncate(max(size - leave, 0))
    return max(size - leave, 0)


def kill_at(point: str, step: int) -> None:
    """Send this process VPO_KILL_SIGNAL when the loop reaches VPO_KILL_AT's point and step; fill
    the disk at VPO_FILL_AT's."""
    if os.environ.get("VPO_KILL_AT") == f"{point}:{step}":
        name = os.environ.get("VPO_KILL_SIGNAL", "KILL").upper().removeprefix("SIG")
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
    if os.environ.get("VPO_FILL_AT") == f"{point}:{step}":
        fill_disk(os.environ["VPO_FILL_FILE"], int(os.environ.get("VPO_FILL_LEAVE", "0")))


def main(argv: list[str]) -> int:
    if os.environ.get("VPO_KILL_AT") or os.environ.get("VPO_FILL_AT"):
        loop.train = functools.partial(loop.train, on_event=kill_at)  # the commands call it so
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
