"""A `verifiers` environment under `vpo train --env`: the adapter, nothing to change in it.

`verifiers` (Prime Intellect; PyPI `verifiers`, github.com/PrimeIntellect-ai/verifiers) writes
an environment as a `vf.Environment` (SingleTurnEnv, MultiTurnEnv, ToolEnv, StatefulToolEnv):
a dataset, a rollout loop (`setup_state`, `env_response` after each model message, `@vf.stop`
conditions) and a Rubric of weighted reward functions. `from_verifiers(env)` is the
`make_env` factory of vpo's interface (`vpo.env.base.Environment`), and `--env MODULE:FACTORY`
whose factory returns a `vf.Environment` (a hub module's `load_environment`) is wrapped by it.
What maps to what:

- rows: the environment's dataset (`problems` → `env.get_dataset()` in order, so `--data` is
  optional) or `--data` rows; a row's prompt is its `prompt` column, else the environment's
  system_prompt and few_shot then the `question` column as a user message (as verifiers
  formats its datasets).
- the episode is the environment's own `rollout`, run on an asyncio loop with vpo as the
  model: a verifiers `Client` whose responses are the assistant messages vpo samples. `reset`
  → the row's prompt; `step` → the messages the environment appends before it asks the model
  again (`env_response`: tool results as role "tool", user replies), None once a stop
  condition ends the rollout.
- tools (ToolEnv): vpo renders prompts without the template's `tools` argument, so the system
  message gains a Tools section (each tool's JSON schema and the call format); calls are read
  from the assistant's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the
  Hermes format vLLM's hermes parser reads), the content keeping the text around them.
- `score` → one component per rubric function of weight > 0 (a RubricGroup flattened, named
  by the function), called as verifiers calls it (prompt, completion, answer, state, info,
  parser, ... by parameter name, sync or async); `weights` → w*. Weight-0 functions are
  verifiers' metrics (num_turns, tool-call counts), left out.
- an episode vpo ends first (`--env-turns`, the token budget) is ended as verifiers ends an
  overlong one: its pending model request raises `vf.OverlongPromptError` (stop condition
  prompt_too_long), then it is scored. The environment's own `max_turns` and `--env-turns`
  both apply, so the smaller wins: the environment's ends the rollout (`step` gets None), vpo's
  hands the rollout its last message at `score`, where it ends on its own or as overlong.

Refused by name, where verifiers would log and score 0 or go on: a negative weight (w* is
non-negative: reward `1 - f` with weight |w| instead), a group reward function (vpo scores
each episode alone), a reward that raises, is not a number, not finite or outside [0, 1]
(rescale it in the rubric), a rollout that raises or ends with a verifiers InfraError, an
environment that rewrites earlier turns or changes the prompt in `setup_state` (vpo continues
every episode from its KV cache). The classic API above is verifiers 0.1 - 0.3 (tested with
0.3.1, where it lives in `verifiers.legacy` under its old names); verifiers 0.4 replaced it by
`verifiers.v1` (tasksets and harness programs calling the model through an OpenAI-compatible
server), which `vpo.env.from_verifiers_v1` runs through vpo's own endpoint.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import numbers
import re
from collections.abc import Callable
from typing import Any

from vpo.errors import EnvError
from vpo.tasks.base import ROW

try:
    import verifiers as vf
    from verifiers.clients import Client
    from verifiers.types import Response, ResponseMessage, ToolCall
except ImportError as e:
    raise ImportError(f"vpo.env.from_verifiers drives verifiers' classic environments: pip "
                      f"install 'verifiers<0.4' (here: {e})") from e

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_GROUP_ARGS = {"states", "prompts", "completions", "answers", "tasks", "infos"}


def from_verifiers(env: Any) -> Callable[[], VerifiersEpisode]:
    """The factory of episodes of `env` (a `vf.Environment`), after checking its rubric: each
    call gives one episode (`VerifiersEpisode`); they share `env` and one event loop."""
    if not (callable(getattr(env, "rollout", None)) and hasattr(env, "rubric")):
        raise EnvError(f"{type(env).__module__}.{type(env).__name__} is not a classic "
                       "verifiers environment (vf.Environment: rollout and rubric); verifiers "
                       "0.4's verifiers.v1 environments run through vpo's endpoint "
                       "(vpo.env.from_verifiers_v1)")
    funcs = reward_functions(env.rubric, type(env).__name__)
    loop = asyncio.new_event_loop()

    def make_env() -> VerifiersEpisode:
        return VerifiersEpisode(env, funcs, loop)

    return make_env


def reward_functions(rubric: Any, where: str) -> list[tuple[Any, Callable, float]]:
    """(owning rubric, function, weight) of each function of weight > 0, RubricGroups
    flattened; an `EnvError` for a negative weight, a group function or a repeated name."""
    out = []
    for sub, func, weight in _flatten(rubric):
        if weight < 0:
            raise EnvError(f"{where}: reward function {_name(func)!r} has weight {weight}: "
                           f"vpo's w* are non-negative; reward 1 - {_name(func)} with weight "
                           f"{-weight} instead (it ranks episodes the same)")
        if weight == 0:  # a verifiers metric: logged there, not a reward
            continue
        if _GROUP_ARGS & set(inspect.signature(func).parameters):
            raise EnvError(f"{where}: reward function {_name(func)!r} scores a group of "
                           "rollouts together; vpo scores each episode on its own: write it "
                           "per rollout (prompt, completion, answer, state)")
        out.append((sub, func, float(weight)))
    names = [_name(f) for _, f, _ in out]
    if not names:
        raise EnvError(f"{where}: the rubric has no reward function of weight > 0")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EnvError(f"{where}: several reward functions are named {repeated[0]!r}; vpo "
                       "names each component by its function: rename one")
    return out


def _flatten(rubric: Any):
    """(rubric, function, weight) of every function, through nested RubricGroups."""
    if getattr(rubric, "rubrics", None):
        for sub in rubric.rubrics:
            yield from _flatten(sub)
        return
    yield from ((rubric, f, w) for f, w in zip(rubric.funcs, rubric.weights, strict=True))


def _name(func: Callable) -> str:
    return getattr(func, "__name__", repr(func))


class _Policy(Client):
    """A verifiers Client whose model is vpo: a request waits until vpo answers it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(None)
        self.loop = loop
        self.request = loop.create_future()  # (messages, tools) once the rollout asks
        self.reply: asyncio.Future | None = None
        self.calls = 0

    def answer(self, text: str | None, tools: list) -> None:
        """Answer the pending request with the assistant's `text` (its `<tool_call>` blocks
        read as calls when the request offered tools), or None: the prompt is too long."""
        self.request = self.loop.create_future()
        if text is None:
            self.reply.set_exception(vf.OverlongPromptError("vpo ended the episode "
                                                            "(turn limit or token budget)"))
            return
        calls = []
        if tools:
            for block in _TOOL_CALL.findall(text):
                self.calls += 1
                calls.append(_tool_call(block, f"call_{self.calls}"))
        content = _TOOL_CALL.sub("", text).strip() if calls else text
        self.reply.set_result(Response(id=f"vpo-{self.calls}", created=0, model="vpo",
                                       message=ResponseMessage(
                                           content=content, tool_calls=calls or None,
                                           finish_reason="tool_calls" if calls else "stop",
                                           is_truncated=False)))

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        self.reply = self.loop.create_future()
        self.request.set_result((list(prompt), list(tools or [])))
        return await self.reply

    def setup_client(self, config):
        return None

    async def to_native_tool(self, tool):
        return tool

    async def to_native_prompt(self, messages):
        return messages, {}

    async def raise_from_native_response(self, response) -> None:
        return None

    async def from_native_response(self, response) -> Response:
        return response

    async def close(self) -> None:
        return None


def _tool_call(block: str, call_id: str) -> ToolCall:
    """A `<tool_call>` block as a verifiers ToolCall; one that is not {"name", "arguments"}
    JSON keeps its text as the arguments (the environment answers with its parse error)."""
    try:
        call = json.loads(block)
    except json.JSONDecodeError:
        call = None
    if isinstance(call, dict) and isinstance(call.get("name"), str):
        args = call.get("arguments", {})
        return ToolCall(id=call_id, name=call["name"],
                        arguments=args if isinstance(args, str) else json.dumps(args))
    return ToolCall(id=call_id, name="", arguments=block)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)


def _plain(message: Any) -> dict[str, str]:
    """A verifiers message (dict or pydantic) as vpo's {"role", "content"} text message."""
    content = _get(message, "content")
    if isinstance(content, list):
        if any(_get(p, "type") != "text" for p in content):
            raise ValueError(f"a {_get(message, 'role')} message has non-text content parts; "
                             "vpo feeds text only")
        content = "".join(_get(p, "text") for p in content)
    return {"role": str(_get(message, "role")), "content": content or ""}


def _with_tools(messages: list[dict[str, str]], tools: list) -> list[dict[str, str]]:
    """`messages` with the tools described in the system message (one added if none)."""
    if not tools:
        return messages
    schemas = "\n".join(json.dumps({"name": _get(t, "name"), "description": _get(t, "description"),
                                    "parameters": _get(t, "parameters")}) for t in tools)
    section = ("# Tools\n\nYou may call one or more of these functions; their signatures are "
               f"within <tools></tools>:\n<tools>\n{schemas}\n</tools>\n\nFor each call, write a "
               "JSON object with the function name and arguments within <tool_call></tool_call> "
               'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
               "\n</tool_call>")
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{section}" if first else section},
                *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


class VerifiersEpisode:
    """One episode of a verifiers environment in vpo's interface (see the module docstring)."""

    def __init__(self, env: Any, funcs: list[tuple[Any, Callable, float]],
                 loop: asyncio.AbstractEventLoop):
        self.env, self.funcs, self.loop = env, funcs, loop
        self.reward_names = tuple(_name(f) for _, f, _ in funcs)
        self.weights = tuple(w for _, _, w in funcs)
        self.input: dict[str, Any] = {}
        self.task: asyncio.Task | None = None
        self.policy: _Policy | None = None
        self.asked: list[dict[str, str]] = []  # the pending request's messages
        self.tools: list = []  # the tools the pending request offers
        self.described: list[str] = []  # the tools reset described
        self.fed = 0  # assistant messages given to the rollout

    def problems(self, seed: int, num: int) -> list[dict[str, Any]]:
        """The first `num` rows of the environment's dataset (`seed` unused: in order, as
        `--data` rows are taken)."""
        return self.env.get_dataset(n=num).to_list()

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        """The row's prompt (with the Tools section when the environment has tools)."""
        example_id = row.get("example_id", row.get(ROW, 0))
        row = {k: v for k, v in row.items() if not k.startswith("_")}  # vpo's own keys
        prompt = row.get("prompt")
        if prompt is None:
            if "question" not in row:
                raise ValueError(f"a verifiers row needs a 'prompt' (messages) or a 'question' "
                                 f"column; this one has {sorted(row)}")
            system = self.env.system_prompt
            prompt = [*([{"role": "system", "content": system}] if system else []),
                      *(self.env.few_shot or []), {"role": "user", "content": row["question"]}]
        elif isinstance(prompt, str):
            raise ValueError("a verifiers row's prompt is a string (completion format); vpo "
                             "runs chat environments: give the prompt as messages")
        elif self.env.system_prompt and _get(prompt[0], "role") != "system":
            prompt = [{"role": "system", "content": self.env.system_prompt}, *prompt]
        prompt = [_plain(m) for m in prompt]
        self.input = {**row, "prompt": prompt, "example_id": example_id}
        info = row.get("info")
        info = json.loads(info) if isinstance(info, str) else info
        self.tools = list((info or {}).get("tool_defs") or self.env.tool_defs or [])
        self.described = [_get(t, "name") for t in self.tools]
        self.task, self.fed = None, 0
        return _with_tools(prompt, self.tools)

    def step(self, messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
        """The environment's reply to the last assistant message, None once it ends."""
        return self._advance(messages)

    def score(self, messages: list[dict[str, str]]) -> list[float]:
        """Each reward function's value on the finished rollout (one ended by vpo first is
        ended as overlong), then the rubric's cleanup."""
        self._advance(messages)
        if not self.task.done():
            self.policy.answer(None, [])
            self._run()
        state = self.task.result()
        return self.loop.run_until_complete(self._rewards(state))

    def _run(self) -> None:
        """Run the loop until the rollout asks the model again or ends."""
        self.loop.run_until_complete(asyncio.wait({self.task, self.policy.request},
                                                  return_when=asyncio.FIRST_COMPLETED))
        if self.task.done():
            error = self.task.result().get("error")  # raises what the rollout raised
            if isinstance(error, getattr(vf, "InfraError", ())):
                raise RuntimeError(f"the rollout ended with verifiers' {type(error).__name__}:"
                                   f" {error}")
            return
        asked, self.tools = self.policy.request.result()
        self.asked = [_plain(m) for m in asked]

    def _advance(self, messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
        """Give the rollout the assistant messages it has not seen → the messages it appended
        after the last one (None: it ended)."""
        if self.task is None:
            self.policy = _Policy(self.loop)
            self.task = self.loop.create_task(self.env.rollout(self.input, self.policy, "vpo"))
            self._run()
            if not self.task.done() and (self.asked != self.input["prompt"] or self.described
                                         != [_get(t, "name") for t in self.tools]):
                raise ValueError("the rollout's first request differs from the row's prompt or "
                                 "tools (setup_state or get_prompt_messages changed them); vpo "
                                 "renders the prompt from the row alone")
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        new: list[dict[str, str]] | None = None
        for text in said[self.fed:]:
            if self.task.done():
                return None
            before = self.asked
            self.fed += 1
            self.policy.answer(text, self.tools)
            self._run()
            if self.task.done():
                return None
            n = len(before) + 1
            if len(self.asked) < n or self.asked[:n - 1] != before or (
                    self.asked[n - 1]["role"] != "assistant"):
                raise ValueError("the environment's next request does not extend the "
                                 "conversation (a get_prompt_messages that rewrites earlier "
                                 "turns); vpo continues each episode from its KV cache")
            new = self.asked[n:]
            if not new:
                raise ValueError("env_response returned no messages; after an assistant "
                                 "message vpo needs the observation, or the rollout to stop")
        return new

    async def _rewards(self, state: Any) -> list[float]:
        values = []
        for rubric, func, _ in self.funcs:
            name = _name(func)
            objects = rubric.score_objects(state)
            params = inspect.signature(func).parameters
            if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
                objects = {k: v for k, v in objects.items() if k in params}
            try:
                value = func(**objects)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as e:
                raise ValueError(f"verifiers reward function {name!r} raised "
                                 f"{type(e).__name__}: {e}") from e
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"verifiers reward function {name!r} returned {value!r}; it "
                                 "must return a finite number")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"verifiers reward function {name!r} returned {value}; vpo's "
                                 "components are in [0, 1]: rescale it in the rubric (e.g. "
                                 "reward min(1, value / most))")
            values.append(float(value))
        await self.env.rubric.cleanup(state)
        return values
