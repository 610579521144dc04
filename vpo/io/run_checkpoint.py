"""Orbax checkpoints of a run: {train state, data-iterator position, config json}, saved together.

Each step directory is written atomically by orbax (temporary directory, then rename and commit
marker), so an interrupted save never shadows the previous checkpoint. `restore` takes the newest
step that restores cleanly and falls back to older ones, warning about each it skips and moving
it aside (`damaged-<step>`) so the run can save that step again; when none restores, a
`CheckpointError` names the folder and each step's failure.

A LoRA state (a `TrainState` whose `frozen` holds the base weights) is saved without its base:
the step holds the adapters, optimiser state, step and rng, and a `base` item
{"spec", "checksum"}: the base's `base_checksum` and what it was loaded from. `restore` takes
the base from the state it restores onto and refuses (`CheckpointError` naming both specs) a
base whose checksum differs, since the adapters were trained on the recorded one.

A save that fails on the disk (no space left, no permission, an I/O error, raised by orbax from
its background thread) is a `CheckpointWriteError` naming the folder, the step, the free space
and `--resume`: seen at the next `check` (each step), `save` or `wait`, never waited on. The
steps saved before it stay complete.

A trained policy on its own (weights, tokenizer, config) is a policy folder:
`vpo.io.policy_folder`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from vpo.errors import CheckpointError, CheckpointWriteError
from vpo.io.checkpoint_errors import (
    _named_leaves,
    _one_line,
    _reasons,
    _steps,
    _why_not,
    quiet_failed_reads,
    write_failure,
)
from vpo.io.files import free_space

log = logging.getLogger(__name__)


def abstract_like(tree):
    """ShapeDtypeStructs (with each array's sharding) to restore a pytree onto the same layout."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def base_checksum(tree) -> str:
    """A content hash of a pytree of arrays: sha256 over each leaf's path, shape, dtype and two
    sums of its bit patterns as uint32 (Σ bits and Σ (2i+1)·bits over the flat index i, both
    mod 2³²). Integer sums wrap exactly in any order, so the value does not depend on the
    device, sharding or reduction order; computed on device in one pass over the arrays."""
    import hashlib

    import numpy as np

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    sums = _bit_sums([x for _, x in flat])
    h = hashlib.sha256()
    for (path, x), s in zip(flat, sums, strict=True):
        s = np.asarray(s.addressable_data(0))
        h.update(f"{jax.tree_util.keystr(path)}|{x.shape}|{x.dtype}|{s[0]}|{s[1]}\n".encode())
    return h.hexdigest()


@jax.jit
def _bit_sums(leaves):
    import jax.numpy as jnp

    def sums(x):
        bits = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32,
                                                 8: jnp.uint32}[x.dtype.itemsize])
        bits = bits.reshape(-1).astype(jnp.uint32)
        i = jnp.arange(bits.size, dtype=jnp.uint32)
        return jnp.stack([jnp.sum(bits, dtype=jnp.uint32),
                          jnp.sum(bits * (2 * i + 1), dtype=jnp.uint32)])

    return [sums(x) for x in leaves]


def _frozen(state):
    """The base weights of a LoRA `TrainState` (its `frozen` field), else None."""
    return getattr(state, "frozen", None)


def _stored(state):
    """The tree a state is saved as: a `TrainState` as the mapping of its fields (orbax keys a
    NamedTuple's fields by name all the same), without `pending` when no rollout is in flight,
    so a synchronous run's checkpoints keep the layout they had before the field existed and
    either kind restores into the other's code."""
    if not hasattr(state, "_asdict"):
        return state
    fields = state._asdict()
    if fields.get("pending", False) is None:
        del fields["pending"]
    return fields


def _unstored(like_state, tree):
    """`_stored`'s inverse onto `like_state`'s type (the absent `pending` as None)."""
    return type(like_state)(**tree) if hasattr(like_state, "_asdict") else tree


class CheckpointManager:
    """Keeps the last `keep` checkpoints under `directory` (steps as sub-directories).

    `base`: what a LoRA state's frozen weights were loaded from (a model spec, or a phrase such
    as "random init, seed 0"), recorded with their checksum and named if they change."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True,
                 base: str | None = None):
        directory = os.path.abspath(directory)  # orbax restores from absolute paths only
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise CheckpointError(f"{directory}: is a file, not a checkpoint folder; move or "
                                  "delete it (the run keeps its orbax checkpoints there)")
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        quiet_failed_reads()  # and failed writes: the same noise after a named error
        self._mngr = ocp.CheckpointManager(directory, options=options,
                                           item_names=("state", "data", "config", "base"))
        self.directory = directory
        self.base = base
        self._saving: int | None = None  # the step of the save in flight (not yet waited on)

    def all_steps(self) -> list[int]:
        self._mngr.reload()
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, state, data_iterator=None, config: dict[str, Any] | None = None
             ) -> None:
        """Save asynchronously (device→host copies happen before this returns, so the caller may
        donate `state` to the next step right away). The previous save is waited on first: its
        failure is a `CheckpointWriteError`, and so is this one's."""
        self.wait()
        data = {} if data_iterator is None else data_iterator.get_state()
        items = {}
        if _frozen(state) is not None:  # LoRA: adapters + optimiser state; the base by reference
            items["base"] = ocp.args.JsonSave({"spec": self.base,
                                               "checksum": base_checksum(_frozen(state))})
            state = state._replace(frozen=None)
        self._saving = step
        try:
            self._mngr.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(_stored(state)), data=ocp.args.JsonSave(data),
                config=ocp.args.JsonSave(config or {}), **items))
        except Exception as e:
            self._raise_write_error(e)
            raise

    def check(self) -> None:
        """Raise `CheckpointWriteError` if the save in flight has finished and failed; returns
        at once while it is still writing (a cheap call, made after every step)."""
        if self._saving is not None and not self._mngr.is_saving_in_progress():
            self.wait()

    def _raise_write_error(self, e: BaseException) -> None:
        """Raise `CheckpointWriteError` (from `e`) if `e` is a write that failed on the disk
        (`write_failure`), naming the step, the folder, the free space and the newest complete
        checkpoint; otherwise return."""
        failure = write_failure(e)
        step, self._saving = self._saving, None
        if failure is None:
            return
        what, fix = failure
        try:
            done = [s for s in self.all_steps() if s != step]
        except Exception:  # noqa: BLE001 -- a folder that cannot be listed either
            done = []
        newest = (f"the newest complete checkpoint is step {done[-1]}" if done else
                  "no checkpoint is complete yet (--resume starts the run over)")
        raise CheckpointWriteError(
            f"{self.directory}: the checkpoint of step {step} was not written ({what}; "
            f"{free_space(self.directory)} free); {newest}. {fix[0].upper()}{fix[1:]}, then run "
            "the same command with --resume to continue from it") from e

    def restore(self, like_state, data_iterator=None, *, step: int | None = None,
                config: dict[str, Any] | None = None):
        """Restore onto the structure and shardings of `like_state`'s arrays → (state, step).

        Without `step`, the newest checkpoint that restores; older ones are tried if it fails.
        The data iterator, when given, is moved to the saved position. A LoRA checkpoint saved
        without its base takes `like_state.frozen` as the base, after checking its checksum.
        Each step that does not restore is named in a few words (`_why_not`: the array and
        its shapes, a truncated file); when none does, one `CheckpointError` names them all;
        `config` (the run's config now) lets an array of another shape name the model fields
        that differ from the config the checkpoints were saved with. Orbax's own text is on the
        error's cause (`vpo --debug`).
        """
        self.wait()
        steps = [step] if step is not None else self.all_steps()[::-1]
        if not steps:
            raise CheckpointError(f"{self.directory}: no checkpoint to restore")
        frozen = _frozen(like_state)
        checksum = None if frozen is None else base_checksum(frozen)
        quiet_failed_reads()
        errors = []
        for s in steps:
            by_ref = frozen is not None and os.path.isdir(os.path.join(self.directory, str(s),
                                                                       "base"))
            like = like_state._replace(frozen=None) if by_ref else like_state
            base = {"base": ocp.args.JsonRestore()} if by_ref else {}
            abstract = abstract_like(_stored(like))
            shape = self._other_shape(s, abstract)
            if shape is not None:
                errors.append((s, shape, True, None))
                continue
            try:
                out = self._mngr.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract),
                    data=ocp.args.JsonRestore(), config=ocp.args.JsonRestore(), **base))
            except Exception as e:  # noqa: BLE001 -- a damaged step: try the previous one
                errors.append((s, _why_not(e), "not compatible with the stored shape" in str(e),
                               e))
                continue
            state = _unstored(like_state, out.state)
            if by_ref:
                self._check_base(s, out.base, checksum)
                state = state._replace(frozen=frozen)
            if data_iterator is not None and out.data:
                try:
                    data_iterator.set_state(out.data)
                except Exception as e:  # noqa: BLE001 -- a damaged data position
                    errors.append((s, f"data position: {_one_line(e, 60)}", False, e))
                    continue
            if errors:
                log.warning("%s: restored step %d; %s did not restore (%s)", self.directory, s,
                            _steps([t for t, *_ in errors]), _reasons(errors))
            if step is None:
                self._set_aside([t for t in steps if t > s])
            return state, s
        cause = next((e for *_, e in errors if e is not None), None)
        if all(shape for _, _, shape, _ in errors):
            differ = self._config_differs(errors[0][0], config)
            raise CheckpointError(
                f"{self.directory}: the checkpoints hold another model than the run's ("
                f"{_reasons(errors)}{'; ' + differ if differ else ''}); resume with the config "
                "they were saved with (config.json), or start a new run in another --out"
                ) from cause
        raise CheckpointError(f"{self.directory}: no checkpoint restores, all are damaged ("
                              f"{_reasons(errors)}); restore a copy of the folder, or start the "
                              "run over (--overwrite)") from cause

    def _other_shape(self, step: int, abstract) -> str | None:
        """'<array> (found) saved, (expected) now' for the first array of
        `step`'s saved state whose shape or dtype differs from `abstract`'s (params first, then
        the rest; '+N more'), or None: all agree, or the metadata does not read (the restore
        then says what is wrong)."""
        from etils import epath

        try:
            meta = ocp.StandardCheckpointHandler().metadata(
                epath.Path(self.directory) / str(step) / "state")
            saved = dict(_named_leaves(getattr(meta, "tree", meta)))
        except Exception:  # noqa: BLE001 -- unreadable metadata: the restore names the damage
            return None
        differ = []
        for name, want in _named_leaves(abstract):
            got = saved.get(name)
            if got is None or not hasattr(got, "shape"):
                continue
            found = (tuple(got.shape), str(getattr(got, "dtype", want.dtype)))
            if found != (tuple(want.shape), str(want.dtype)):
                differ.append((not name.startswith("params"), name, found,
                               (tuple(want.shape), str(want.dtype))))
        if not differ:
            return None
        _, name, found, want = min(differ)
        show = (lambda x: f"{x[0]} {x[1]}") if found[1] != want[1] else (lambda x: str(x[0]))
        more = f", +{len(differ) - 1} arrays" if len(differ) > 1 else ""
        return f"{name} {show(found)} saved, {show(want)} now{more}"

    def _config_differs(self, step: int, config: dict[str, Any] | None) -> str:
        """'model.dim 32 saved, 64 now' for the model fields where `config` differs from the
        config saved with `step` (at most 3), or ''."""
        if not config:
            return ""
        try:
            saved = self.config(step)
        except Exception:  # noqa: BLE001 -- no readable config beside the state
            return ""
        import json

        old = (saved or {}).get("model") or {}
        new = json.loads(json.dumps(config.get("model") or {}))  # tuples as the JSON lists saved
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return ", ".join(f"model.{k} {old.get(k)} saved, {new.get(k)} now" for k in keys[:3])

    def _check_base(self, step: int, recorded, checksum: str) -> None:
        """Raise `CheckpointError` unless the base restored onto is the one `step` was saved
        with (its checksum)."""
        recorded = recorded if isinstance(recorded, dict) else {}
        if recorded.get("checksum") == checksum:
            return
        raise CheckpointError(
            f"{self.directory}: the base model is not the one the LoRA adapters of step {step} "
            f"were trained on: they were saved on {recorded.get('spec') or 'an unnamed base'} "
            f"(checksum {str(recorded.get('checksum'))[:16]}), the base given now "
            f"({self.base or 'unnamed'}) has checksum {checksum[:16]}; the file changed or "
            "another model was given. Put back the base the run started from, or start a new "
            "run")

    def _set_aside(self, damaged: list[int]) -> None:
        """Rename the step folders that did not restore to `damaged-<step>` (kept for a look,
        out of orbax's way: the resumed run saves those steps again)."""
        if jax.process_index() == 0:
            for s in damaged:
                path = os.path.join(self.directory, str(s))
                if os.path.isdir(path):
                    os.replace(path, os.path.join(self.directory, f"damaged-{s}"))
        self._mngr.reload()

    def config(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        return self._mngr.restore(step, args=ocp.args.Composite(
            config=ocp.args.JsonRestore())).config

    def wait(self) -> None:
        """Wait for the save in flight; its failure is a `CheckpointWriteError`."""
        try:
            self._mngr.wait_until_finished()
        except Exception as e:
            self._raise_write_error(e)
            raise
        self._saving = None

    def close(self) -> None:
        self.wait()
        self._mngr.close()
