"""How a model's initial weights are drawn: in the caller's program, or each by its own.

`draw_weight(init, key, shape, dtype, axes)` is `init(key, shape, dtype)` unless a
`drawing_weights(draw)` block is open, where `draw` makes it instead (`vpo.rl.step.init_state`
compiles one small program per distinct (initialiser, shape, dtype, sharding), each born
sharded, instead of one program holding every draw). Initialisers are shared objects
(`normal`), so that such programs can be cached by them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

from flax import nnx

_DRAW = contextvars.ContextVar("vpo_draw_weight", default=None)


@functools.cache
def normal(stddev: float):
    """The N(0, stddev²) initialiser, one object per stddev."""
    return nnx.initializers.normal(stddev)


zeros = nnx.initializers.zeros


@contextlib.contextmanager
def drawing_weights(draw):
    """Within this block every `draw_weight` call is `draw(init, key, shape, dtype, axes)`."""
    token = _DRAW.set(draw)
    try:
        yield
    finally:
        _DRAW.reset(token)


def draw_weight(init, key, shape, dtype, axes):
    """An initial weight value: `init(key, shape, dtype)`, or the open block's `draw`. `axes`:
    its logical axis names (`vpo.model.sharding`)."""
    draw = _DRAW.get()
    return init(key, shape, dtype) if draw is None else draw(init, key, shape, dtype, axes)
