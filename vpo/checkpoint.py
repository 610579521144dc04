"""Orbax checkpoints of a run: {train state, data-iterator position, config json}, saved together.

Each step directory is written atomically by orbax (temporary directory, then rename and commit
marker), so an interrupted save never shadows the previous checkpoint. `restore` takes the newest
step that restores cleanly and falls back to older ones, warning about each it skips.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def abstract_like(tree):
    """ShapeDtypeStructs (with each array's sharding) to restore a pytree onto the same layout."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


class CheckpointManager:
    """Keeps the last `keep` checkpoints under `directory` (steps as sub-directories)."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self._mngr = ocp.CheckpointManager(directory, options=options,
                                           item_names=("state", "data", "config"))
        self.directory = directory

    def all_steps(self) -> list[int]:
        self._mngr.reload()
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, state, data_iterator=None, config: dict[str, Any] | None = None
             ) -> None:
        """Save asynchronously (device→host copies happen before this returns, so the caller may
        donate `state` to the next step right away)."""
        data = {} if data_iterator is None else data_iterator.get_state()
        self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
            config=ocp.args.JsonSave(config or {})))

    def restore(self, like_state, data_iterator=None, *, step: int | None = None):
        """Restore onto the structure and shardings of `like_state`'s arrays → (state, step).

        Without `step`, the newest checkpoint that restores; older ones are tried if it fails.
        The data iterator, when given, is moved to the saved position.
        """
        self.wait()
        steps = [step] if step is not None else self.all_steps()[::-1]
        if not steps:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        abstract = abstract_like(like_state)
        errors = []
        for s in steps:
            try:
                out = self._mngr.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore(),
                    config=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001 -- a damaged step: try the previous one
                log.warning("checkpoint step %d under %s did not restore (%s); trying an older "
                            "one", s, self.directory, e)
                errors.append(f"step {s}: {e}")
                continue
            if data_iterator is not None and out.data:
                data_iterator.set_state(out.data)
            return out.state, s
        raise RuntimeError(f"no checkpoint under {self.directory} restores: " + "; ".join(errors))

    def config(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        return self._mngr.restore(step, args=ocp.args.Composite(
            config=ocp.args.JsonRestore())).config

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.close()
