"""An OpenEnv environment under `vpo train --env`, run in-process.

OpenEnv (Meta / PyTorch; PyPI `openenv-core`, github.com/meta-pytorch/OpenEnv) writes an
environment as a subclass of `openenv.core.env_server.interfaces.Environment`: `reset(seed,
episode_id, **kwargs) -> Observation`, `step(action) -> Observation` and a `state` property,
where `Action` and `Observation` are pydantic models (`openenv.core.env_server.types`) and an
observation carries `done`, a scalar `reward` (of the last step) and `metadata`. OpenEnv
usually serves an environment over HTTP / WebSocket (`HTTPEnvServer`, `EnvClient`, docker);
this adapter calls the Environment object itself, with no server. `from_openenv(make)` is the
`make_env` factory of vpo's interface (`vpo.env.base.Environment`), one OpenEnv environment
`make()` per episode, and `--env MODULE:FACTORY` whose factory returns an OpenEnv Environment
is wrapped by it with the defaults below. What maps to what:

- `reset(row)` → `env.reset(**kwargs)` with the row's columns that are named parameters of
  the environment's `reset` (`seed`, `episode_id`, its own), or `reset_kwargs(row)`; the first
  messages are `system` (if given) and the reset observation rendered as a user message.
- rendering an observation (`render(obs) -> str`, by default): its fields other than done,
  reward and metadata; a single string field is the text, otherwise they are written as JSON.
- `step(messages)` → the action built from the assistant's last message (`parse_action(text)
  -> Action`; by default, for an Action class with one string field, that field is the text,
  otherwise the text is read as the action's JSON), `env.step(action)`, its observation as one
  `role` message (default "user"), or None once an observation is `done`. An action that does
  not parse (a ValueError, pydantic's ValidationError included) is not stepped: the reply is a
  user message naming the error, and the episode goes on.
- `score` → the components: "reward", the episode's summed step rewards (None counts as 0)
  rescaled from `reward_range` (lo, hi) into [0, 1] (outside it is an error: declare the
  range), then each name of `metadata_rewards`, read from the last observation's metadata
  (each in [0, 1]; None where the key is absent). `weights` (default all 1) are w*.

OpenEnv rewards are per step and unbounded; vpo's components are per episode in [0, 1], hence
the declared range. Tested with openenv-core 0.3.0.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import typing
from collections.abc import Callable, Sequence
from typing import Any

from vpo.errors import EnvError

try:
    from openenv.core.env_server.types import Action, Observation
except ImportError as e:
    raise ImportError(f"vpo.env.from_openenv drives OpenEnv environments: pip install "
                      f"openenv-core (here: {e})") from e

Render = Callable[[Any], str]
ParseAction = Callable[[str], Any]
_BASE_FIELDS = {"done", "reward", "metadata"}


def is_openenv(env: Any) -> bool:
    """Whether `env` is an OpenEnv Environment (reset / step / state, from openenv)."""
    return any(c.__module__.startswith("openenv.") and c.__name__ == "Environment"
               for c in type(env).__mro__)


def from_openenv(make: Callable[[], Any], *, render: Render | None = None,
                 parse_action: ParseAction | None = None,
                 reset_kwargs: Callable[[dict], dict] | None = None, system: str | None = None,
                 role: str = "user", reward_range: tuple[float, float] = (0.0, 1.0),
                 metadata_rewards: Sequence[str] = (), weights: Sequence[float] | None = None,
                 ) -> Callable[[], OpenEnvEpisode]:
    """The factory of episodes, each on a new OpenEnv environment `make()` (an Environment
    subclass, or a function returning one); the options are those of the module docstring."""
    lo, hi = (float(x) for x in reward_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise EnvError(f"from_openenv: reward_range must be (lo, hi) with lo < hi, the range "
                       f"of an episode's summed reward; got {reward_range!r}")
    names = ("reward", *metadata_rewards)
    if weights is None:
        weights = (1.0,) * len(names)
    if len(weights) != len(names):
        raise EnvError(f"from_openenv: {len(weights)} weights for {len(names)} components "
                       f"{names!r}; give one weight per component")
    if role not in ("user", "tool"):
        raise EnvError(f"from_openenv: role must be 'user' or 'tool', got {role!r}")
    options = dict(render=render or render_observation, parse_action=parse_action,
                   reset_kwargs=reset_kwargs, system=system, role=role, reward_range=(lo, hi),
                   names=names, weights=tuple(weights))

    def make_env() -> OpenEnvEpisode:
        return OpenEnvEpisode(make(), **options)

    return make_env


def render_observation(obs: Any) -> str:
    """The default text of an observation: its one string field other than done, reward and
    metadata, else those fields as JSON."""
    fields = {k: v for k, v in obs.model_dump().items() if k not in _BASE_FIELDS}
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return next(iter(fields.values()))
    return json.dumps(fields, default=str)


def action_class(env: Any) -> type:
    """The Action class of `env`: its step's `action` annotation, else its Environment base's
    first type argument; a ValueError if neither names an OpenEnv Action."""
    try:
        cls = typing.get_type_hints(type(env).step).get("action")
    except Exception:  # noqa: BLE001 -- unresolvable annotations: try the generic base
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Action) and cls is not Action):
        for base in getattr(type(env), "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type) and issubclass(args[0], Action):
                cls = args[0]
                break
    if not (isinstance(cls, type) and issubclass(cls, Action) and cls is not Action):
        raise ValueError(f"{type(env).__name__}: its Action class is not in step's `action` "
                       "annotation nor in Environment[Action, Observation, State]: annotate "
                       "it, or give from_openenv a parse_action(text) -> Action")
    return cls


def default_parse_action(cls: type) -> ParseAction:
    """text → `cls` (an OpenEnv Action): its one string field set to the text, else the text
    read as the action's JSON."""
    strings = [k for k, f in cls.model_fields.items()
               if k != "metadata" and f.annotation is str]
    others = [k for k in cls.model_fields if k != "metadata" and k not in strings]
    if len(strings) == 1 and not any(cls.model_fields[k].is_required() for k in others):
        return lambda text: cls(**{strings[0]: text})
    return cls.model_validate_json


class OpenEnvEpisode:
    """One episode of an OpenEnv environment in vpo's interface (see the module docstring)."""

    def __init__(self, env: Any, *, render: Render, parse_action: ParseAction | None,
                 reset_kwargs: Callable[[dict], dict] | None, system: str | None, role: str,
                 reward_range: tuple[float, float], names: tuple[str, ...],
                 weights: tuple[float, ...]):
        if not is_openenv(env):
            raise ValueError(f"from_openenv: {type(env).__name__} is not an OpenEnv Environment "
                           "(openenv.core.env_server.interfaces.Environment); an EnvClient of "
                           "a served environment is not driven: give the Environment itself")
        self.env, self.render, self.system, self.role = env, render, system, role
        self.parse_action = parse_action or default_parse_action(action_class(env))
        self.reset_kwargs = reset_kwargs or self._reset_columns
        self.range, self.reward_names, self.weights = reward_range, names, weights
        self.total, self.last, self.done = 0.0, None, False

    def _reset_columns(self, row: dict) -> dict:
        params = inspect.signature(self.env.reset).parameters
        return {k: v for k, v in row.items() if k in params
                and params[k].kind in (params[k].POSITIONAL_OR_KEYWORD, params[k].KEYWORD_ONLY)}

    def _observe(self, obs: Any, call: str) -> str:
        if not isinstance(obs, Observation):
            raise ValueError(f"{type(self.env).__name__}.{call} returned "
                             f"{type(obs).__name__}, not an OpenEnv Observation")
        reward = obs.reward
        if reward is not None and (isinstance(reward, bool) or not isinstance(
                reward, numbers.Real) or not math.isfinite(reward)):
            raise ValueError(f"{type(self.env).__name__}.{call}: the observation's reward is "
                             f"{reward!r}; it must be a finite number or None")
        self.total += float(reward or 0.0)
        self.last, self.done = obs, bool(obs.done)
        text = self.render(obs)
        if not isinstance(text, str):
            raise ValueError(f"render returned {type(text).__name__}, not a string")
        return text

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        """The system message (if given) and the reset observation as a user message."""
        kwargs = self.reset_kwargs({k: v for k, v in row.items() if not k.startswith("_")})
        text = self._observe(self.env.reset(**kwargs), "reset")
        if self.done:
            raise ValueError(f"{type(self.env).__name__}.reset returned an observation that is "
                             "already done; an episode needs at least one step")
        self.total = 0.0  # a reward at reset is not the episode's
        return [*([{"role": "system", "content": self.system}] if self.system else []),
                {"role": "user", "content": text}]

    def step(self, messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
        """The observation after the action of the last assistant message (None: done)."""
        if self.done:
            return None
        try:
            action = self.parse_action(messages[-1]["content"])
        except ValueError as e:  # the model's malformed action: told, not stepped
            return [{"role": "user", "content": f"Invalid action: {e}"}]
        text = self._observe(self.env.step(action), "step")
        return None if self.done else [{"role": self.role, "content": text}]

    def score(self, messages: list[dict[str, str]]) -> list[float | None]:
        """The summed reward rescaled from the declared range, then the metadata rewards."""
        lo, hi = self.range
        if not lo - 1e-9 <= self.total <= hi + 1e-9:
            raise ValueError(f"the episode's summed reward {self.total:g} is outside "
                             f"reward_range ({lo:g}, {hi:g}); give from_openenv the range "
                             "of the environment's episode reward")
        values: list[float | None] = [min(1.0, max(0.0, (self.total - lo) / (hi - lo)))]
        metadata = self.last.metadata if self.last is not None else {}
        for name in self.reward_names[1:]:
            v = metadata.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
                raise ValueError(f"the observation's metadata[{name!r}] is {v!r}; a reward "
                                 "component must be a number in [0, 1]")
            values.append(None if v is None else float(v))  # vpo checks [0, 1]
        self.env.close()
        return values
