"""`vpo serve`: a policy behind an OpenAI-compatible HTTP endpoint (`vpo.serve.app` in front of
`vpo.serve.engine`), for evaluation harnesses, environments and agent code."""

from __future__ import annotations

import argparse
import os
import sys
import time

from vpo.launch.policy_runs import stage

DEFAULT_MAX_TOKENS = 256
DEFAULT_PROMPT_TOKENS = 512


def served_model(args: argparse.Namespace):
    """(model, tokenizer, name) of `--policy` (a policy folder, hf:PATH or smollm2) or, without
    it, a randomly initialised `--preset` model with the tokenizer of `--task`, built as
    `vpo sample` builds it for the same --seed (a speed check)."""
    from vpo.config import model_preset

    if args.policy is not None:
        from vpo.io.policy_folder import load_model

        stage(f"loading {args.policy} ...")
        model, tokenizer, _ = load_model(args.policy)
        stage(f"loaded {args.policy} ({model.cfg.num_params:,} params)")
        name = args.served_name or os.path.basename(os.path.normpath(args.policy))
        return model, tokenizer, name
    from flax import nnx

    from vpo.launch.rules import load_task
    from vpo.model.decoder import Decoder

    tokenizer = load_task(args.task, args.preset).tokenizer
    length = (args.max_prompt_tokens or DEFAULT_PROMPT_TOKENS) + (args.max_tokens
                                                                 or DEFAULT_MAX_TOKENS)
    model = Decoder(model_preset(args.preset, vocab_size=tokenizer.size, max_seq_len=length),
                    rngs=nnx.Rngs(args.seed))
    return model, tokenizer, args.served_name or args.preset


def capacity(model, max_tokens: int | None, prompt_tokens: int | None) -> tuple[int, int]:
    """(prompt capacity P, new-token capacity T): the options given, else the defaults fitted
    into the model's positions (T at most half of them); a ConfigError when they do not fit."""
    from vpo.config import ConfigError

    L = model.cfg.max_seq_len
    T = max_tokens or min(DEFAULT_MAX_TOKENS, L // 2)
    P = prompt_tokens or min(DEFAULT_PROMPT_TOKENS, L - T)
    if P < 1 or P + T > L:
        raise ConfigError(f"--max-prompt-tokens {P} + --max-tokens {T} exceed the {L} "
                          "positions of the model; lower one of them")
    return P, T


def build(args: argparse.Namespace):
    """(engine, limits) of the parsed arguments; the engine is not started."""
    from vpo.serve.engine import Engine
    from vpo.serve.protocol import Limits
    from vpo.serve.tools import tool_format

    model, tokenizer, name = served_model(args)
    P, T = capacity(model, args.max_tokens, args.max_prompt_tokens)
    engine = Engine(model, tokenizer, slots=args.slots, prompt_len=P, max_new_tokens=T,
                    chunk=args.chunk, queue=args.queue, seed=args.seed)
    return engine, Limits(name, P, T, max_rows=min(args.queue, 128),
                          tool_format=tool_format(tokenizer.chat_template))


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a policy over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions,
    /v1/models): requests are batched into the jitted sampler through refilled slots; each
    response carries token ids and, with logprobs, the log-probs the trainer computes."""
    import jax

    from vpo.cli.arguments import check_args
    from vpo.config import ConfigError

    try:
        import uvicorn

        from vpo.serve.app import make_app
    except ImportError as e:
        raise ConfigError(f"vpo serve needs Starlette and uvicorn ({e}): pip install -e "
                          "'.[serve]'") from None

    check_args(args, positive=("slots", "chunk", "queue", "max_tokens", "max_prompt_tokens"))
    if args.compile_cache and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(args.compile_cache))
    engine, limits = build(args)
    if args.warmup:
        t0 = time.perf_counter()
        engine.warmup()
        stage(f"compiled every prefill, decode and scoring bucket in "
              f"{time.perf_counter() - t0:.1f}s")
    stage(f"serving {limits.model!r} on http://{args.host}:{args.port}/v1 ({args.slots} slots, "
          f"prompts up to {limits.prompt_len} tokens, up to {limits.max_new_tokens} new)")
    engine.start()
    try:
        app = make_app(engine, limits, access_log=None if args.quiet else sys.stderr)
        uvicorn.run(app, host=args.host, port=args.port,
                    log_level="warning", timeout_graceful_shutdown=10)
    finally:
        engine.close()
    return 0


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", "--model", dest="policy", default=None,
                   help="policy folder (vpo sft / vpo train --out), hf:PATH or smollm2; "
                   "default: a random --preset model")
    p.add_argument("--preset", default="tiny", help="model preset without --policy: random "
                   "weights (docs/usage.md#model-presets)")
    p.add_argument("--task", default="maze", help="without --policy: the task whose tokenizer "
                   "the --preset model reads")
    p.add_argument("--served-name", default=None, help="the model name clients send (default: "
                   "the policy folder's name, or the preset)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--slots", type=int, default=16, help="rows decoding at once; a finished "
                   "row takes the next waiting one")
    p.add_argument("--max-tokens", type=int, default=None, help="the most new tokens of a "
                   f"completion (default {DEFAULT_MAX_TOKENS}, at most half the model's "
                   "positions)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="the longest prompt "
                   f"(default {DEFAULT_PROMPT_TOKENS}, within the model's positions)")
    p.add_argument("--chunk", type=int, default=32, help="decode steps per compiled call at "
                   "most (a call ends early when a request waits and a slot is free for it)")
    p.add_argument("--queue", type=int, default=256, help="rows waiting at most; past it a "
                   "request gets 503")
    p.add_argument("--warmup", action="store_true", help="compile every prefill (rows "
                   "admitted x prompt length bucket), decode chunk and prompt-scoring bucket "
                   "before serving: no request then compiles")
    p.add_argument("--seed", type=int, default=0, help="the --preset model's init and the "
                   "seeds of requests that send none")
    p.add_argument("--quiet", action="store_true", help="no access log (by default each "
                   "request writes a line to stderr: method, path, status, tokens, ms)")
    p.add_argument("--compile-cache", default="~/.cache/vpo/jax",
                   help="persistent XLA compile cache ('' to disable)")
