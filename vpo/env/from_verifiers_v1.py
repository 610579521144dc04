"""A verifiers 0.4 environment (`verifiers.v1`) under `vpo train --env`, through vpo's endpoint.

verifiers 0.4 writes an environment as a `vf.Env` (most often `vf.SingleAgentEnv`): a Taskset
yielding Tasks (their `TaskData`: prompt, system_prompt, the task's own fields; their
`@vf.reward` methods, weighted, and plugged judges) and a Harness, the agent program, which
calls the model through an OpenAI-compatible endpoint (verifiers' interception server, which
relays each request to the `ModelContext`'s client `base_url`). vpo does not sample these
episodes itself: each step it serves the policy being trained (`vpo serve`'s engine and app,
`vpo.rl.env_served`), runs the environment's own episodes against it, and reads back from its
own server what the harness's requests got: the prompt's and the completion's token ids and
log-probs, per episode (verifiers sends the trace id as `X-Session-ID`). What maps to what:

- `from_verifiers_v1(env)` is the `make_env` factory of vpo's interface; `--env
  MODULE:FACTORY` whose factory returns a `verifiers.v1` Env is wrapped by it
  (`vpo.env.base.load_env_factory`). Rows: the taskset's tasks (`problems` → their TaskData,
  in order) or `--data` rows read as the task's TaskData; `reset` → the prompt a chat harness
  sends (system_prompt, then the prompt as a user message, or the prompt's messages): the
  row's prompt in vpo's batch.
- the tokens trained on: the last request of the episode, its prompt then its completion,
  exactly as the server tokenised and sampled them (`episode_tokens`); the mask holds each
  completion of the episode that this sequence contains as it was sampled (the same prompt
  tokens before it, the same tokens): the last one always, an earlier one unless the chat
  template re-rendered it differently (then it is context, not trained on; `env/turns_trained`
  counts those trained). Everything the harness and its tools added is context. The episode's
  token budget is `sampler.max_new_tokens` after the row's prompt: a longer conversation is cut
  there (not `finished`).
- `score` → the trace's rewards, one component per reward of the task (`reward_names`:
  `@vf.reward` methods and plugged judges, named as verifiers names them); `weights` → their
  weights (w*). Each value is checked as the classic adapter checks it.

Refused by name: a negative weight, a reward that is not a finite number in [0, 1] or that
records keys of its own (a dict), an episode that ends with errors (the harness or the model
call failed: verifiers' trace errors), an episode of several agents, a request for several
choices (`n`), an episode whose first request is not the row's prompt. vpo's own multi-turn
interface (`step`, `score` on messages) is not how these run: called, they say so.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vpo.errors import EnvError

try:
    import verifiers.v1 as vf
except ImportError as e:
    raise ImportError(f"vpo.env.from_verifiers_v1 drives verifiers 0.4 environments: pip "
                      f"install 'verifiers>=0.4' (here: {e})") from e

SESSION = "x-session-id"  # the header verifiers' clients send with each model request


def is_v1_env(env: Any) -> bool:
    """Whether `env` is a verifiers 0.4 Env (`verifiers.v1`)."""
    return isinstance(env, vf.Env)


def from_verifiers_v1(env: Any) -> Callable[[], VerifiersV1Episode]:
    """The factory of `env`'s episodes in vpo's interface, after reading its rewards."""
    if not is_v1_env(env):
        raise EnvError(f"{type(env).__name__} is not a verifiers.v1 Env")
    first = next(iter(env.taskset), None)
    if first is None:
        raise EnvError(f"{type(env).__name__}: its taskset yields no task")
    names, weights = reward_spec(first, type(env).__name__)

    def make_env() -> VerifiersV1Episode:
        return VerifiersV1Episode(env, names, weights)

    make_env.through_endpoint = True  # vpo.rl.env_step samples it with vpo.rl.env_served
    return make_env


def reward_spec(task: Any, where: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """(names, weights) of a task's rewards: its `@vf.reward` methods and plugged judges, in
    verifiers' order; an `EnvError` for a negative weight, none of weight > 0, or a repeat."""
    out = [(fn.__name__, float(getattr(fn, "_vf_weight", 1.0))) for fn in task.hooks("reward")]
    out += [(j.reward_name, float(j.config.weight)) for j in task.plugged_judges()]
    for name, w in out:
        if not math.isfinite(w) or w < 0:
            raise EnvError(f"{where}: reward {name!r} has weight {w}: vpo's w* are finite and "
                           f"non-negative; reward 1 - {name} with weight {abs(w)} instead")
    names = [n for n, _ in out]
    if not out or not any(w > 0 for _, w in out):
        raise EnvError(f"{where}: the task has no reward of weight > 0 (@vf.reward)")
    if len(set(names)) != len(names):
        raise EnvError(f"{where}: several rewards are named {names!r}; rename one")
    return tuple(names), tuple(w for _, w in out)


def _plain(message: Any) -> dict[str, str]:
    """A verifiers message (pydantic) or a dict as vpo's {"role", "content"} text message."""
    get = message.get if isinstance(message, dict) else lambda k: getattr(message, k, None)
    content = get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "") if isinstance(p, dict) else
                              getattr(p, "text", "")) for p in content)
    return {"role": str(get("role")), "content": content or ""}


class VerifiersV1Episode:
    """A verifiers 0.4 environment in vpo's interface: rows, the prompt, the reward names and
    weights (see the module docstring); its episodes run through the endpoint."""

    def __init__(self, env: Any, names: Sequence[str], weights: Sequence[float]):
        self.env = env
        self.reward_names, self.weights = tuple(names), tuple(weights)

    def problems(self, seed: int, num: int) -> list[dict[str, Any]]:
        """The first `num` tasks' data, in order (`seed` unused, as `--data` rows are taken)."""
        return [t.data.model_dump(mode="json", exclude_none=True)
                for t in itertools.islice(self.env.taskset, num)]

    def task(self, row: dict[str, Any]) -> Any:
        """The row (a task's data, vpo's `_` keys aside) as the taskset's Task."""
        cls = type(self.env.taskset).task_type()
        data = cls.data_type().model_validate({k: v for k, v in row.items()
                                              if not k.startswith("_")})
        return cls(data, self.env.taskset.config.task)

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        """The messages a chat harness sends first: the system prompt, then the prompt."""
        data = self.task(row).data
        prompt = data.prompt
        messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else
                    [_plain(m) for m in prompt or []])
        if data.system_prompt:
            messages = [{"role": "system", "content": data.system_prompt}, *messages]
        if not messages:
            raise ValueError("the task has no prompt; vpo trains on episodes the model opens "
                             "after a prompt")
        return messages

    def step(self, messages):
        raise EnvError("a verifiers.v1 environment runs its own episodes against vpo's "
                       "endpoint (vpo train --env); it has no step of vpo's interface")

    def score(self, messages):
        raise EnvError("a verifiers.v1 environment scores its own episodes (vpo train "
                       "--env); it has no score of vpo's interface")


async def _run_all(env: Any, tasks: Sequence[Any], ctx: Any) -> list[Any]:
    async with env.serving():
        return await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))


def run_v1_episodes(env: Any, tasks: Sequence[Any], base_url: str, model: str,
                    sampling: dict[str, Any], where: str) -> list[Any]:
    """Run one episode of each task (`env.run_episode`, concurrently, inside
    `env.serving()`) with the model at `base_url` (an OpenAI-compatible server, here vpo's)
    and `sampling` (temperature, top_p, max_tokens, ... sent with every request) → each
    episode's one trace, after checking that it ran without errors."""
    ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(
        base_url=base_url, api_key_var="VPO_SERVE_KEY"), sampling=vf.SamplingConfig(**sampling))
    episodes = asyncio.run(_run_all(env, tasks, ctx))
    traces = []
    for i, ep in enumerate(episodes):
        errors = [*ep.errors, *(e for t in ep.traces for e in t.errors)]
        if errors:
            e = errors[-1]
            raise EnvError(f"{where}: the verifiers episode of task {i} failed: {e.type}: "
                           f"{e.message}"[:2000])
        if len(ep.traces) != 1:
            raise EnvError(f"{where}: the verifiers episode of task {i} ran {len(ep.traces)} "
                           "agents; vpo trains one agent per episode (a SingleAgentEnv)")
        traces.append(ep.traces[0])
    return traces


def trace_rewards(trace: Any, names: Sequence[str], where: str, row: Any) -> list[float]:
    """The trace's reward of each name, each a finite number in [0, 1], or an `EnvError`."""
    extra = sorted(set(trace.rewards) - set(names))
    if extra:
        raise EnvError(f"{where}: on row {row} the episode recorded rewards {extra} besides "
                       f"{list(names)}; vpo names each component by its reward function "
                       "(a reward returning a dict of scores is not one component)")
    out = []
    for name in names:
        r = trace.rewards.get(name)
        value = None if r is None else r.score
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(
                value):
            raise EnvError(f"{where}: on row {row} verifiers reward {name!r} is {value!r}; it "
                           "must be a finite number")
        if not 0.0 <= value <= 1.0:
            raise EnvError(f"{where}: on row {row} verifiers reward {name!r} is {value}; vpo's "
                           "components are in [0, 1]: rescale it in the task (e.g. "
                           "min(1, value / most))")
        out.append(float(value))
    return out


def episode_tokens(calls: Sequence[dict[str, Any]], prompt: Sequence[int], T: int, where: str,
                   row: Any) -> dict[str, Any]:
    """One episode's training sequence from the server's record of its requests (`calls`, in
    the order answered: prompt_token_ids, token_ids, logprobs) → {tokens, mask, logp: [T]
    arrays after `prompt`, trained: completions masked in, finished: the conversation fits
    T}. The sequence is the last call's prompt and completion; call k's completion is masked
    in where that sequence holds call k's prompt and completion as they were (module
    docstring)."""
    if not calls:
        raise EnvError(f"{where}: on row {row} the episode made no model request")
    last = calls[-1]
    seq = list(last["prompt_token_ids"]) + list(last["token_ids"])
    P = len(prompt)
    if seq[:P] != list(prompt):
        raise EnvError(f"{where}: on row {row} the episode's requests do not start with the "
                       "row's prompt (the task's system prompt and prompt as the chat template "
                       "renders them); vpo trains on what follows that prompt")
    tokens = np.zeros((T,), np.int32)
    mask = np.zeros((T,), bool)
    logp = np.zeros((T,), np.float32)
    after = seq[P:]
    tokens[:min(T, len(after))] = after[:T]
    trained = 0
    for call in calls:
        start, done = len(call["prompt_token_ids"]), list(call["token_ids"])
        if start < P or seq[:start + len(done)] != list(call["prompt_token_ids"]) + done:
            continue
        lp = call.get("logprobs") or [0.0] * len(done)
        lo, hi = start - P, min(T, start - P + len(done))
        if hi > lo:
            mask[lo:hi] = True
            logp[lo:hi] = lp[:hi - lo]
            trained += 1
    return {"tokens": tokens, "mask": mask, "logp": logp, "trained": trained,
            "finished": len(after) <= T, "length": min(T, len(after))}


def chat_calls(record: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat completions the server answered (its JSON responses, in order) as calls:
    prompt_token_ids, token_ids, logprobs (None unless asked for)."""
    calls = []
    for body in record:
        choices = body.get("choices") or []
        if len(choices) != 1:
            raise EnvError(f"a model request of the episode asked for {len(choices)} choices; "
                           "vpo trains on one completion per request (n = 1)")
        c = choices[0]
        content = (c.get("logprobs") or {}).get("content")
        calls.append({"prompt_token_ids": body["prompt_token_ids"],
                      "token_ids": c["token_ids"],
                      "logprobs": [t["logprob"] for t in content] if content else None})
    return calls


def trace_messages(trace: Any) -> list[dict[str, str]]:
    """The trace's final conversation as vpo's text messages (for the sample log)."""
    return [_plain(m) for m in trace.messages]
