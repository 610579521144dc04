"""`vpo` with the kill soak's fault injection: run any `vpo` command line, and when
`VPO_KILL_AT=point:step` names one of the training loop's points (`vpo.rl.loop.EVENTS`), send
this process `VPO_KILL_SIGNAL` (KILL, INT or TERM; default KILL) as the loop passes it.

    VPO_KILL_AT=logged:2 VPO_KILL_SIGNAL=INT python experiments/kill_at.py train --out D

The library loop only reports its points (`train(on_event=...)`); the kill lives here.
"""

from __future__ import annotations

import functools
import os
import signal
import sys

from vpo.cli import main as cli
from vpo.rl import loop


def kill_at(point: str, step: int) -> None:
    """Send this process VPO_KILL_SIGNAL when the loop reaches VPO_KILL_AT's point and step."""
    if os.environ.get("VPO_KILL_AT") == f"{point}:{step}":
        name = os.environ.get("VPO_KILL_SIGNAL", "KILL").upper().removeprefix("SIG")
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))


def main(argv: list[str]) -> int:
    if os.environ.get("VPO_KILL_AT"):  # the commands call loop.train through the module
        loop.train = functools.partial(loop.train, on_event=kill_at)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
