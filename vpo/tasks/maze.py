"""The designed-conflict maze as an in-graph task (VPO arXiv 2605.22817, digest §1.4 Maze row).

World, generator and rules: `vpo.tasks.maze_world`. Here: the token layout, the jnp reward and
the `Task` factory.

Prompt (P = n(n+1) + 4 tokens for an n x n grid):
    <bos> row_1 / row_2 / ... row_n / budget <B> m<k>
with one cell token per tile (`.` `#` `lava` `gold` `diamond` `start` `exit`) and the step budget B
as a number token. Answer: a route of move tokens `U D L R` (at most A = answer_len moves).

Reward (linear PAPER_REPRO shape, digest §1.11 item 3), R = 4:
    r = completion * (1, gold_collected / gold_total, diamonds_collected / diamonds_total,
                      1 - lava_stepped / lava_total)
completion = 1 iff the route reaches E within the budget; items and lava count only on tiles
entered before E (the gate). Wall bumps stay in place and cost a step. A route containing a
non-move token is invalid (zero row), and so is an exact duplicate of an earlier route in the same
generation. w* = the mean of the four components.

Solved (pass@k): reach E with no lava and ALL items of at least one zone, i.e. the best a single
route can do given the designed conflict (both zones never fit). Such a route always exists
(generator invariant), and it scores w*ᵀr >= 0.75.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import answers as answers_lib
from vpo.tasks import base, maze_world, mutation_demos, prompting
from vpo.tasks import vocab as vocab_lib
from vpo.tasks.maze_world import DIAMOND, EXIT, GOLD, LAVA, WALL

CELL_TOKENS = (".", "#", "lava", "gold", "diamond", "start", "exit")
ROW_SEP, BUDGET = "/", "budget"
MOVE_TOKENS = tuple(maze_world.MOVES)  # U D L R


class MazeProblems(NamedTuple):
    """grid: int8 [N, n, n] cell codes (maze_world.EMPTY..EXIT); budget: int32 [N] steps."""

    grid: np.ndarray
    budget: np.ndarray


def maze_vocab(cfg: maze_world.MazeConfig, max_answers: int) -> vocab_lib.Vocab:
    """Specials, common tokens, cells, `/`, `budget`, moves, numbers 0..answer_len."""
    numbers = tuple(str(i) for i in range(cfg.answer_len + 1))
    return vocab_lib.make_vocab(vocab_lib.common_tokens(max_answers) + CELL_TOKENS
                                + (ROW_SEP, BUDGET) + MOVE_TOKENS + numbers)


def simulate_route(grid_HW: jax.Array, budget: jax.Array, moves_A: jax.Array,
                   mask_A: jax.Array) -> jax.Array:
    """In-graph twin of `maze_world.route_reward` for one route (move indices 0..3 = U D L R).

    Returns rewards_R float32: (completion, gold, diamond, avoid_lava), gated on completion.
    """
    H, W = grid_HW.shape
    dr_4 = jnp.array([-1, 1, 0, 0], jnp.int32)
    dc_4 = jnp.array([0, 0, -1, 1], jnp.int32)

    def step(carry, x):
        r, c, t, done, t_exit, visited_HW = carry
        move, live = x
        active = live & ~done
        nr = r + dr_4[move]
        nc = c + dc_4[move]
        inside = (nr >= 0) & (nr < H) & (nc >= 0) & (nc < W)
        nr_c, nc_c = jnp.clip(nr, 0, H - 1), jnp.clip(nc, 0, W - 1)
        ok = inside & (grid_HW[nr_c, nc_c] != WALL)
        r = jnp.where(active & ok, nr_c, r)
        c = jnp.where(active & ok, nc_c, c)
        t = t + active.astype(jnp.int32)
        visited_HW = visited_HW.at[r, c].set(visited_HW[r, c] | active)
        arrive = active & (grid_HW[r, c] == EXIT)
        return (r, c, t, done | arrive, jnp.where(arrive, t, t_exit), visited_HW), None

    init = (jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.bool_(False), jnp.int32(0),
            jnp.zeros((H, W), bool))
    (_, _, _, done, t_exit, visited_HW), _ = jax.lax.scan(step, init, (moves_A, mask_A))
    completion = done & (t_exit <= budget)

    def frac(kind):
        is_kind = grid_HW == kind
        total = jnp.sum(is_kind.astype(jnp.float32))
        got = jnp.sum((is_kind & visited_HW).astype(jnp.float32))
        return got / jnp.maximum(total, 1.0), total

    gold, _ = frac(GOLD)
    diamond, _ = frac(DIAMOND)
    lava, n_lava = frac(LAVA)
    avoid = jnp.where(n_lava > 0, 1.0 - lava, 1.0)
    rewards_R = jnp.stack([jnp.float32(1.0), gold, diamond, avoid])
    return jnp.where(completion, rewards_R, 0.0).astype(jnp.float32)


def make_maze_task(size: int = 5, *, max_answers: int = 8, **config) -> base.Task:
    """The maze `Task` on an odd `size` grid; `config` overrides `maze_world.MazeConfig` fields.

    The default (5x5, 2-3 items per zone within radius 1, 1-2 lava tiles, budget slack 3, A = 16)
    is small enough for a ~1M-parameter policy on CPU; `make_paper_maze_task()` is the 9x9 setting.
    """
    cfg = maze_world.MazeConfig(size=size, **config)
    vocab = maze_vocab(cfg, max_answers)
    n, A = cfg.size, cfg.answer_len
    cell0, move0, num0 = vocab.id(CELL_TOKENS[0]), vocab.id(MOVE_TOKENS[0]), vocab.id("0")

    def make_problems(seed: int, num: int) -> MazeProblems:
        rng = np.random.default_rng(seed)
        grids, budgets = zip(*(maze_world.generate(rng, cfg) for _ in range(num)), strict=True)
        return MazeProblems(np.stack(grids).astype(np.int8), np.asarray(budgets, np.int32))

    def statement(problem):  # the grid row by row, then `budget <B>`
        grid_HW = jnp.asarray(problem.grid, jnp.int32)
        rows = jnp.concatenate([cell0 + grid_HW, jnp.full((n, 1), vocab.id(ROW_SEP))], axis=1)
        budget = num0 + jnp.asarray(problem.budget, jnp.int32)
        return [prompting.fixed(rows.reshape(-1)), prompting.fixed([vocab.id(BUDGET)]),
                prompting.fixed(jnp.reshape(budget, (1,)))]

    prompts = prompting.prompt_functions(vocab, statement, statement_len=n * (n + 1) + 2,
                                         answer_len=A, num_rewards=4, max_answers=max_answers)

    def reward(problem, completion_T, mask_T, num_answers: int):
        answers_MA, amask_MA, valid_M = answers_lib.split_answers(
            completion_T, mask_T, num_answers=num_answers, answer_len=A)
        move_MA = answers_MA - move0
        is_move_MA = (move_MA >= 0) & (move_MA < 4)
        valid_M = valid_M & jnp.all(is_move_MA | ~amask_MA, axis=-1)
        valid_M = answers_lib.first_occurrence(answers_MA, amask_MA, valid_M)
        grid_HW = jnp.asarray(problem.grid, jnp.int32)
        rewards_MR = jax.vmap(simulate_route, in_axes=(None, None, 0, 0))(
            grid_HW, problem.budget, jnp.clip(move_MA, 0, 3), amask_MA)
        return jnp.where(valid_M[:, None], rewards_MR, 0.0), valid_M

    def solved(rewards_R):
        full = rewards_R >= 1.0 - 1e-6
        return full[0] & full[3] & (full[1] | full[2])

    def demonstrations(problem, rng: np.random.Generator, num_answers: int) -> list[int]:
        routes = demo_routes(np.asarray(problem.grid), int(problem.budget), rng, num_answers)
        return base.join_answers([vocab.encode(r) for r in routes])

    def mutation_demonstrations(problem, rng: np.random.Generator, num_parents: int,
                                num_answers: int) -> tuple[list[list[int]], list[list[int]]]:
        # Children: the best distinct routes found (full-zone tours first). Parents: 0..3 random
        # edits of a child, a demonstration route or a child cut short (`shortcut_route`) that
        # score below every child.
        grid, budget = np.asarray(problem.grid), int(problem.budget)

        def fitness(route):
            return float(np.mean(maze_world.route_reward(grid, budget, route)))

        demos = demo_routes(grid, budget, rng, 3)
        children = better_routes(grid, budget, rng, num_answers, fitness, demos)
        sources = children + [r for r in demos if r not in children] + [
            shortcut_route(grid, children[rng.integers(len(children))], rng) for _ in range(3)]
        parents = mutation_demos.weaker_parents(
            sources, fitness, min(map(fitness, children)), MOVE_TOKENS, rng,
            num_parents=num_parents, max_len=A, exclude=children)
        return [vocab.encode(p) for p in parents], [vocab.encode(c) for c in children]

    return base.Task(
        name=f"maze{n}", vocab=vocab, reward_names=maze_world.REWARD_NAMES,
        eval_weights_R=np.full((4,), 0.25, np.float32), answer_len=A,
        make_problems=make_problems, reward=reward, solved=solved,
        demonstrations=demonstrations, mutation_demonstrations=mutation_demonstrations,
        max_answers=max_answers, **prompts._asdict())


def make_paper_maze_task(*, max_answers: int = 8) -> base.Task:
    """The paper's 9x9 setting: 3-5 items per zone within radius 2, 3-5 lava tiles, slack 7."""
    return make_maze_task(9, max_answers=max_answers, zone_radius=2, items=(3, 5), lava=(3, 5),
                          open_frac=0.4, slack=7, answer_len=40)


def demo_routes(grid: np.ndarray, budget: int, rng: np.random.Generator, num_answers: int,
                tries: int = 30) -> list[list[str]]:
    """`num_answers` distinct scoring routes, lava-free and within budget.

    Slots take the kinds via-gold, via-diamond and direct (in random order), then `part` routes
    that collect a random non-empty part of one zone. A slot whose kind only reproduces earlier
    routes (a unique shortest path may pass the gold zone) falls back to `part` routes and to
    `wander` routes through a random open tile. If even those repeat, the slot repeats a route
    (the reward masks it as a duplicate); that needs num_answers far above 3 on a tiny grid.
    """
    gold, diamond = maze_world.zone_items(grid, GOLD), maze_world.zone_items(grid, DIAMOND)
    open_tiles = maze_world.zone_items(grid, maze_world.EMPTY)

    def waypoints(kind: str):
        if kind == "direct":
            return []
        if kind == "wander":
            return [open_tiles[rng.integers(len(open_tiles))]] if open_tiles else []
        items = gold if kind == "gold" else diamond
        if kind == "part":
            items = gold if rng.random() < 0.5 else diamond
            keep = rng.permutation(len(items))[:rng.integers(1, len(items) + 1)]
            items = [items[i] for i in sorted(keep)]
        return maze_world.best_tour(grid, items, avoid_lava=True)[1]

    kinds = [str(k) for k in rng.permutation(["gold", "diamond", "direct"])]
    routes: list[list[str]] = []
    for slot in range(num_answers):
        for attempt in range(tries):
            kind = kinds[slot] if slot < len(kinds) and attempt < tries // 3 else (
                "part" if attempt % 2 else "wander")
            try:
                route = maze_world.plan_route(grid, waypoints(kind), rng)
            except ValueError:  # a wander tile that no lava-free route reaches
                continue
            if route not in routes and len(route) <= budget:
                break
        routes.append(route)
    return routes


def better_routes(grid: np.ndarray, budget: int, rng: np.random.Generator, num_answers: int,
                  fitness, fallback: list[list[str]], tries: int = 6) -> list[list[str]]:
    """`num_answers` distinct routes, best first: lava-free full tours of the gold and of the
    diamond zone with random shortest legs (each scores >= 0.75, see `solved`), topped up with
    the best `fallback` routes when the tours have too few distinct variants."""
    orders = [maze_world.best_tour(grid, maze_world.zone_items(grid, kind), avoid_lava=True)[1]
              for kind in (GOLD, DIAMOND)]
    found: list[list[str]] = []
    for t in range(tries * num_answers):
        route = maze_world.plan_route(grid, orders[t % 2], rng)
        if route not in found and len(route) <= budget:
            found.append(route)
        if len(found) == num_answers:
            break
    extra = [r for r in fallback if r not in found]
    found += sorted(extra, key=fitness, reverse=True)[:num_answers - len(found)]
    return sorted(found, key=fitness, reverse=True)


def shortcut_route(grid: np.ndarray, route: list[str], rng: np.random.Generator) -> list[str]:
    """A random prefix of `route`, then a random shortest path to E from where it stands (through
    lava half of the time): a complete route that usually misses items or steps on lava."""
    n = grid.shape[0]
    k = int(rng.integers(1, len(route)))
    pos = maze_world.corners(n)["start"]
    for m in route[:k]:
        nr, nc = pos[0] + maze_world.MOVES[m][0], pos[1] + maze_world.MOVES[m][1]
        if 0 <= nr < n and 0 <= nc < n and grid[nr, nc] != WALL:
            pos = (nr, nc)
    inverse = {d: m for m, d in maze_world.MOVES.items()}
    out, cur = list(route[:k]), pos
    try:
        path = maze_world._random_path(grid, pos, maze_world.corners(n)["exit"], rng,
                                       avoid_lava=bool(rng.random() < 0.5))
    except ValueError:
        return out
    for nxt in path:
        out.append(inverse[(nxt[0] - cur[0], nxt[1] - cur[1])])
        cur = nxt
    return out
