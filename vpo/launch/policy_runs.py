"""The runs that read a trained policy or a checkpoint, built from a command's parts: `vpo eval`
(`eval_runs`: one `EvalRun` per policy), `vpo search` (`search_run`) and `vpo sample`
(`sample_run`: a `SampleRun`, or an `EpisodeRun` on an environment), and what they share: the
policy loaded with its task (`policy_and_task`), the generation budget (`budget_of`) and the
policy's fit to the task (`vpo.launch.rules.check_fit`). The commands (`vpo.cli.policy`,
`vpo.cli.sample`) run what is built here and print; the heavy imports are made on first use
(keeps `vpo --help` fast)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any


def stage(text: str) -> None:
    """A progress line on stderr (a stage of a command that takes a while)."""
    print(text, file=sys.stderr, flush=True)


def load_policy_model(policy: str, **overrides):
    """`load_model(policy)` → (model, info), with a line on stderr before and after (reading
    a checkpoint can take a while)."""
    from vpo.io.policy_folder import load_model

    stage(f"loading {policy} ...")
    t0 = time.perf_counter()
    model, _, info = load_model(policy, **overrides)
    stage(f"loaded {policy} ({model.cfg.num_params:,} params) in "
          f"{time.perf_counter() - t0:.1f}s")
    return model, info


def policy_and_task(policy: str, task_name: str | None, dataset: dict | None, *,
                    default: str = "maze", difficulty: str | None = None,
                    env: dict | None = None, **overrides):
    """(model, policy info, bound task) of a policy argument: `dataset` (from `--data`) is the
    task when given; else `task_name`, else the task the policy was trained on (its own
    settings, e.g. a maze size or your data's files; trained on a share of your rows
    (`--eval-fraction`): the rows held out from it), else `default` (an hf: checkpoint).
    `difficulty` is --difficulty, which only `program` has. `env`: the task_kwargs of `--env`
    (`vpo.cli.arguments.env_kwargs`), an environment as the task. `overrides`: `load_model`'s."""
    from vpo.config import ConfigError
    from vpo.launch.rules import load_task

    model, info = load_policy_model(policy, **overrides)
    if env is not None:
        return model, info, load_task("env", policy, env)
    if dataset is not None:
        return model, info, load_task("dataset", policy, dataset)
    own = info.get("task")
    name = task_name or own or default
    if difficulty and name != "program":
        raise ConfigError(f"--difficulty {difficulty}: only --task program has difficulties; "
                          "drop it")
    kwargs = dict(info.get("task_kwargs") or {}) if name == own else {}
    if kwargs.get("split") == "train":  # trained on a share of your rows: read the others
        kwargs["split"] = "eval"
        stage(f"{policy} was trained with rows of {kwargs.get('path')} held out "
              f"(--eval-fraction {kwargs.get('eval_fraction')}): reading those held-out rows")
    if name == "program":
        kwargs["difficulty"] = difficulty or kwargs.get("difficulty", "hard")
    return model, info, load_task(name, policy, kwargs or None)


def budget_of(task, num_answers: int, policy: str | None, given: int | None, *,
              records=None, num_parents: int = 0) -> int:
    """The generation budget of a command: `vpo.launch.rules.completion_budget` (the one
    rule: --max-new-tokens, else the policy's `vpo train` run budget, else the task's answer
    budget); --max-new-tokens on an in-graph task is refused. With `records`, a pretrained
    policy's context bounds it (`vpo.launch.rules.fit_budget`, the rule `vpo train` follows):
    a budget the user left out is fitted to what the longest prompt leaves, and one that still
    does not fit is refused naming what helps, instead of generating past the positions the
    checkpoint was trained on."""
    from vpo.config import ConfigError
    from vpo.launch.rules import SEQ_MARGIN, completion_budget, context_of, fit_budget, fit_seq_len
    from vpo.tasks.bound import HostTask

    if given is not None and not isinstance(task, HostTask):
        raise ConfigError(f"--max-new-tokens: the {task.name} task's answers have their own "
                          "budget in one jit; the flag sets the budget of host-scored tasks "
                          "(--data, arithmetic). Drop it")
    budget = completion_budget(task, num_answers, policy=policy, given=given)
    context = context_of(policy) if policy and records else None
    if context is None:
        return budget
    prompt_len = task.prompt_arrays(records, num_answers)[0].shape[1]
    need = max(fit_seq_len(task, num_answers, records=records, num_parents=num_parents,
                           max_new_tokens=budget) - SEQ_MARGIN, prompt_len + budget)
    try:
        fitted = fit_budget(task, num_answers, prompt_len, need, budget, context=context,
                            given=given is not None, spec=policy, num_parents=num_parents)
    except ConfigError as e:  # name the command's flags beside the run's settings
        text = (str(e).replace("sampler.max_new_tokens", "--max-new-tokens")
                .replace("train.num_answers", "--answers")
                .replace("set train.mutation_fraction=0", "lower --parents"))
        raise ConfigError(text) from None
    if fitted != budget:
        stage(f"generation budget fitted from {budget} to {fitted} tokens: the longest prompt "
              f"({prompt_len} tokens) leaves {fitted} of the {context} positions {policy} was "
              "trained on (--max-new-tokens sets it)")
    return fitted


def fitted_model(model, task, records, num_answers: int, policy: str, max_new_tokens: int):
    """`model`, or, when the prompts and the budget need more positions than it has
    (`vpo.launch.rules.fit_seq_len`), `policy` loaded again with room for them."""
    from vpo.launch.rules import fit_seq_len

    need = fit_seq_len(task, num_answers, records=records, at_least=model.cfg.max_seq_len,
                       max_new_tokens=max_new_tokens)
    if need > model.cfg.max_seq_len:  # room for the prompts and the budget
        model, _ = load_policy_model(policy, max_seq_len=need)
    return model


# -- eval -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EvalRun:
    """One policy of `vpo eval`: its row name, the model with room for the prompts and the
    budget, the task, the problems, m and the generation budget."""

    name: str
    model: Any
    task: Any
    problems: list
    num_answers: int
    max_new_tokens: int


def eval_runs(policies: list[str], *, task_name: str | None, dataset: dict | None,
              env: dict | None, answers: int | None, problems: int, seed: int,
              max_new_tokens: int | None) -> Iterator[EvalRun]:
    """The runs of `vpo eval`, one per policy, each built when the previous one is done (one
    policy in memory at a time). Refused before any weights load: --task with --env, and
    policies trained on different tasks without --task or --data; a policy whose task differs
    from the first one's is refused when it loads."""
    from vpo.config import ConfigError
    from vpo.launch.rules import check_fit

    if env and task_name:
        raise ConfigError(f"--task {task_name} with --env: the environment is the task; drop "
                          "--task")
    names = arm_names(policies)
    if task_name is None and dataset is None and env is None:  # before loading any weights
        own = {path: own_task(path) for path in policies}
        if len(set(own.values())) > 1:
            listing = ", ".join(f"{p}: {t or 'none (maze)'}" for p, t in own.items())
            raise ConfigError(f"the policies were trained on different tasks ({listing}): an "
                              "equal-budget table needs one task; pass --task (or --data) to "
                              "evaluate every policy on it")

    def runs() -> Iterator[EvalRun]:
        first = None
        for i, (path, name) in enumerate(zip(policies, names, strict=True), 1):
            stage(f"policy {i}/{len(names)}: {name}")
            model, info, task = policy_and_task(path, task_name, dataset, env=env)
            if first is not None and task.name != first:
                raise ConfigError(f"--policy {path} was trained on {task.name}, --policy "
                                  f"{policies[0]} on {first}: an equal-budget table needs one "
                                  "task; pass --task (or --data) to evaluate every policy on it")
            first = task.name
            m = answers or int(info.get("num_answers", 1))
            records = task.sample_problems(seed, problems)
            check_fit(model.cfg, task, records, m, path)
            T = budget_of(task, m, path, max_new_tokens, records=records)
            model = fitted_model(model, task, records, m, path, T)
            yield EvalRun(name, model, task, records, m, T)

    return runs()


def own_task(path: str) -> str | None:
    """The task a policy folder says it was trained on (policy.json), without loading it."""
    from vpo.io.policy_folder import resolve_model_spec

    info = os.path.join(resolve_model_spec(path), "policy.json")
    if not os.path.isfile(info):
        return None
    with open(info, encoding="utf-8") as f:
        try:
            return json.load(f).get("task")
        except (ValueError, AttributeError):
            return None  # load_model names what is wrong with it


def arm_names(paths: list[str]) -> list[str]:
    """Row names of policy paths: the folder's name (a `policy/` folder: its run's), lengthened
    by parent folders until every name is distinct (`vpo/seed0`, `grpo/seed0`)."""
    parts = []
    for path in paths:
        p = [x for x in os.path.normpath(path).split(os.sep) if x not in ("", ".")]
        parts.append(p[:-1] if len(p) > 1 and p[-1] == "policy" else p)
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{n} [{i}]" for i, n in enumerate(names)]  # the same path given twice


# -- search ---------------------------------------------------------------------------------

# The search settings a command names by its own flags: {config field: flag}.
SEARCH_FLAGS = {"islands": "--islands", "members": "--members", "children": "--children",
                "generations": "--generations", "parents": "--parents",
                "temperature": "--temperature", "num_answers": "--answers",
                "num_slots": "--num-slots"}


@dataclasses.dataclass(frozen=True)
class SearchRun:
    """`vpo search` built: the model, the task, the problems, the search config, the mesh and
    the generation budget (`max_new_tokens`: of a host-scored task, `host`; None in one jit);
    `learn`: the `vpo.config.LearnConfig` of `--learn` (None: the frozen methods only)."""

    model: Any
    task: Any
    records: list
    cfg: Any
    mesh: Any
    host: bool
    budget: int
    max_new_tokens: int | None
    learn: Any = None


# `vpo search`'s flags of the search that learns: {LearnConfig field: flag}.
LEARN_FLAGS = {"objective": "--learn", "learning_rate": "--learn-lr", "lora_rank": "--learn-rank",
               "kl_coef": "--learn-kl", "every": "--learn-every"}


def learn_config(learn: str | None, **given):
    """The `vpo.config.LearnConfig` of `--learn NAME` and its settings (None without
    --learn; a setting without --learn refused); errors name the flags (`LEARN_FLAGS`)."""
    from vpo.config import ConfigError, LearnConfig

    given = {k: v for k, v in given.items() if v is not None}
    if learn is None:
        if given:
            flags = ", ".join(LEARN_FLAGS[k] for k in given)
            raise ConfigError(f"{flags}: settings of the search that learns; add --learn "
                              "grpo|vpo|entropic (or drop them)")
        return None
    try:
        return LearnConfig(objective=learn, **given)
    except ConfigError as e:
        message = str(e)
        for field, flag in LEARN_FLAGS.items():
            message = message.replace(f"learn.{field}:", f"{flag} (learn.{field}):")
        raise ConfigError(message) from None


def learning_result(run: SearchRun, key):
    """The search that learns on `run` (`vpo.search.learn.learning_run` with the RL step of
    `vpo.rl.search_update`) → a `vpo.search.ingraph.SearchResult` (its trace, the final
    populations) and the update's metrics per generation."""
    from vpo.rl.search_update import make_learner
    from vpo.search import ingraph
    from vpo.search.learn import learning_run

    problems = ingraph.search_problems(run.task, list(run.records), run.cfg.num_answers)
    out = learning_run(key, run.model, run.task, problems, run.cfg, run.learn, make_learner,
                       mesh=run.mesh)
    return ingraph.SearchResult(out.trace, out.state.search), out.metrics


def search_run(policy: str, *, task_name: str | None, difficulty: str | None,
               dataset: dict | None, env: dict | None, answers: int | None,
               parents: int | None, problems: int, seed: int, max_new_tokens: int | None,
               learn=None, **search) -> SearchRun:
    """The run of `vpo search`: the policy (4096 positions) and its task (default program),
    `problems` problems of `seed`, the `vpo.search.ingraph.SearchConfig` of `search` (islands,
    members, children, generations, temperature, num_slots) with m = `answers` (default: the
    policy's) and `parents` (default: the config's), a config error naming the command's flags
    (`SEARCH_FLAGS`); --task / --difficulty with --data or --env, and --max-new-tokens on a task
    searched in one jit, refused. `learn`: a `LearnConfig` (`learn_config`), checked against the
    task and the search (`vpo.search.learn.check_learning`: an in-graph reward, groups of calls
    the objective can compare)."""
    from vpo.config import ConfigError
    from vpo.launch.rules import check_fit
    from vpo.model import sharding
    from vpo.search import ingraph
    from vpo.tasks.bound import HostTask

    for flag, value in (("--task", task_name), ("--difficulty", difficulty)):
        if value and (dataset is not None or env is not None):
            what = "--env makes the environment" if env else "--data makes your data"
            raise ConfigError(f"{flag} {value}: {what} the task; drop {flag}")
    model, info, task = policy_and_task(policy, task_name, dataset, default="program",
                                        max_seq_len=4096, difficulty=difficulty, env=env)
    host = isinstance(task, HostTask)  # searched on the host, at a budget that is a setting
    if max_new_tokens is not None and not host:
        raise ConfigError(f"--max-new-tokens: the {task.name} task searches in one jit with its "
                          "own answer budget; the flag sets the budget of host-scored tasks "
                          "(--data, arithmetic). Drop it")
    if parents is not None:
        search["parents"] = parents
    try:
        cfg = ingraph.SearchConfig(num_answers=answers or int(info.get("num_answers", 1)),
                                   **search)
    except ConfigError as e:  # name the flags the user typed beside the config keys
        message = str(e)
        for field, flag in SEARCH_FLAGS.items():
            message = message.replace(f"search.{field}", f"{flag} (search.{field})")
        raise ConfigError(message) from None
    if learn is not None:
        from vpo.search.learn import check_learning

        check_learning(task, cfg, learn)
    records = task.make_problems(seed, problems)
    check_fit(model.cfg, task, records, cfg.num_answers, policy)
    T = budget_of(task, cfg.num_answers, policy, max_new_tokens, records=records,
                  num_parents=cfg.parents)
    return SearchRun(model, task, records, cfg, sharding.make_mesh(), host, T,
                     T if host else None, learn)


# -- sample ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SampleRun:
    """`vpo sample` built on a task of single generations: the model and where it comes from
    (`source`), the task, the problems and their prompt arrays, m and the sampler config."""

    model: Any
    source: str
    task: Any
    records: list
    prompts: Any
    mask: Any
    num_answers: int
    sampler: Any


@dataclasses.dataclass(frozen=True)
class EpisodeRun:
    """`vpo sample` built on an environment: the model, the task, the rows, each episode's
    token budget and the environment factory."""

    model: Any
    task: Any
    records: list
    max_new_tokens: int
    factory: Any


def sample_run(policy: str | None, *, task_name: str | None, preset: str,
               dataset: dict | None, env: dict | None, answers: int | None, prompts: int,
               seed: int, max_new_tokens: int | None, **sampling) -> SampleRun | EpisodeRun:
    """The run of `vpo sample`: `policy` with its own task and m by default (or `dataset`,
    `env`), or without it a randomly initialised `preset` model (seed `seed`) with room for
    the prompts and the budget; `prompts` problems of `seed`; `sampling`: the
    `vpo.config.SamplerConfig` fields besides the budget (num_samples, temperature, top_p,
    top_k, num_slots). On an environment an `EpisodeRun` (a sample is an episode, m = 1)."""
    from flax import nnx

    from vpo.config import SamplerConfig, model_preset
    from vpo.env.task import EnvTask
    from vpo.launch.rules import check_fit, checkpoint_needed, fit_seq_len, load_task
    from vpo.model.decoder import Decoder

    if policy is None:
        if dataset is not None or env is not None:
            raise checkpoint_needed("--env" if env else "--data", preset, opt="--policy ",
                                    folder="--policy POLICY_DIR")
        task, model, info = load_task(task_name or "maze", preset), None, {}
    else:
        model, info, task = policy_and_task(policy, task_name, dataset, env=env)
    if isinstance(task, EnvTask):  # a sample is an episode
        return episode_run(policy, model, task, answers=answers, prompts=prompts, seed=seed,
                           max_new_tokens=max_new_tokens)
    M = answers or int(info.get("num_answers", 3 if model is None else 1))
    records = task.make_problems(seed, prompts)
    tokens, mask = task.prompt_arrays(records, M)
    T = budget_of(task, M, policy, max_new_tokens, records=records)
    if model is None:
        need = fit_seq_len(task, M, records=records, max_new_tokens=T)
        model = Decoder(model_preset(preset, vocab_size=task.tokenizer.size, max_seq_len=need),
                        rngs=nnx.Rngs(seed))
        source = (f"policy '{preset}' ({model.cfg.num_params:,} params, random init, "
                  f"seed {seed})")
    else:
        check_fit(model.cfg, task, records, M, policy)
        model = fitted_model(model, task, records, M, policy, T)
        source = f"policy {policy} ({model.cfg.num_params:,} params)"
    return SampleRun(model, source, task, records, tokens, mask, M,
                     SamplerConfig(max_new_tokens=T, **sampling))


def episode_run(policy: str | None, model, task, *, answers: int | None, prompts: int,
                seed: int, max_new_tokens: int | None) -> EpisodeRun:
    """`vpo sample` on an environment: `prompts` rows of `seed`, one episode per sample."""
    from vpo.config import ConfigError
    from vpo.env.task import env_factory

    if answers not in (None, 1):
        raise ConfigError(f"--answers {answers}: on an environment a sample is one "
                          "episode (m = 1); drop --answers")
    factory = env_factory(task)
    records = task.sample_problems(seed, prompts)
    T = budget_of(task, 1, policy, max_new_tokens, records=records)
    return EpisodeRun(model, task, records, T, factory)
