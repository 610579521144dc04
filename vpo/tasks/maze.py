"""The designed-conflict maze over text (VPO arXiv 2605.22817, digest §1.4 Maze row).

World, generator and rules: `vpo.tasks.maze_world`. Here: the record and text formats, the jnp
reward and the `Task` factory.

Record (JSON-able): `{"grid": ["S.#.g", ...], "budget": 14}`, one string per row and one char
per cell: `S` start, `E` exit, `#` wall, `.` floor, `g` gold, `d` diamond, `x` lava
(`grid_to_record`, `record_grid`). Statement, cells and numbers as whitespace-separated words:

    Maze (S start, E exit, # wall, . floor, g gold, d diamond, x lava):
    S . # . g
    ...
    Go from S to E in at most 14 moves; collect all gold or all diamonds; avoid lava.

Answer: a route of moves `U D L R` separated by spaces, 1..A = answer_len of them (symbol id i
is move i in that order).

Reward (linear PAPER_REPRO shape, digest §1.11 item 3), R = 4:
    r = completion * (1, gold_collected / gold_total, diamonds_collected / diamonds_total,
                      1 - lava_stepped / lava_total)
completion = 1 iff the route reaches E within the budget; items and lava count only on tiles
entered before E (the gate). Wall bumps stay in place and cost a step. A route with a word that
is not a move is invalid (zero row), and so is an exact duplicate of an earlier route in the same
generation. w* = the mean of the four components.

Solved (pass@k): reach E with no lava and ALL items of at least one zone, i.e. the best a single
route can do given the designed conflict (both zones never fit). Such a route always exists
(generator invariant), and it scores w*ᵀr >= 0.75.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import base, maze_world, mutation_demos
from vpo.tasks.maze_world import DIAMOND, EXIT, GOLD, LAVA, WALL

CELL_CHARS = ".#xgdSE"  # CELL_CHARS[code] for the maze_world codes EMPTY..EXIT
MOVES = tuple(maze_world.MOVES)  # U D L R
ANSWER_HINT = "a route of moves U D L R separated by spaces"


class MazeArrays(NamedTuple):
    """grid: int8 [N, n, n] cell codes (maze_world.EMPTY..EXIT); budget: int32 [N] steps."""

    grid: np.ndarray
    budget: np.ndarray


def grid_to_record(grid_HW: np.ndarray, budget: int) -> base.Record:
    """The JSON-able record of one maze: rows as strings of cell chars, and the budget."""
    return {"grid": ["".join(CELL_CHARS[int(v)] for v in row) for row in np.asarray(grid_HW)],
            "budget": int(budget)}


def record_grid(record: base.Record) -> np.ndarray:
    """The int8 [n, n] cell codes of a record's grid."""
    rows = record["grid"]
    bad = sorted({ch for row in rows for ch in row if ch not in CELL_CHARS})
    if bad or any(len(row) != len(rows) for row in rows):
        raise ValueError(f"maze grid must be square rows of the cell chars {CELL_CHARS!r}; "
                         f"got rows {rows}")
    return np.array([[CELL_CHARS.index(ch) for ch in row] for row in rows], np.int8)


def statement(record: base.Record) -> str:
    """The maze as text: legend, one line of space-separated cells per row, the budget."""
    rows = "\n".join(" ".join(row) for row in record["grid"])
    return ("Maze (S start, E exit, # wall, . floor, g gold, d diamond, x lava):\n" + rows
            + f"\nGo from S to E in at most {int(record['budget'])} moves; collect all gold or "
            "all diamonds; avoid lava.")


def solved(rewards_R):
    """Reach E, no lava, all items of at least one zone (jnp; numpy and batched inputs work)."""
    full = jnp.asarray(rewards_R) >= 1.0 - 1e-6
    return full[..., 0] & full[..., 3] & (full[..., 1] | full[..., 2])


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
    is small enough for a tiny policy on CPU; `make_paper_maze_task()` is the 9x9 setting.
    """
    cfg = maze_world.MazeConfig(size=size, **config)
    n, A = cfg.size, cfg.answer_len

    def make_problems(seed: int, num: int) -> list[base.Record]:
        rng = np.random.default_rng(seed)
        return [grid_to_record(*maze_world.generate(rng, cfg)) for _ in range(num)]

    def arrays(records: Sequence[base.Record]) -> MazeArrays:
        return MazeArrays(np.stack([record_grid(r) for r in records]).astype(np.int8),
                          np.array([r["budget"] for r in records], np.int32))

    def symbol_reward(problem: MazeArrays, symbols_A, mask_A):
        return simulate_route(jnp.asarray(problem.grid, jnp.int32), problem.budget,
                              symbols_A, mask_A)

    def score(records, answers):
        return base.score_symbol_answers(
            records, answers, MOVES, A, 4,
            lambda rec, words: maze_world.route_reward(record_grid(rec), rec["budget"], words))

    def demonstrations(record, rng: np.random.Generator, num_answers: int) -> list[str]:
        routes = demo_routes(record_grid(record), record["budget"], rng, num_answers)
        return [" ".join(r) for r in routes]

    def mutation_demonstrations(record, rng: np.random.Generator, num_parents: int,
                                num_answers: int) -> tuple[list[str], list[str]]:
        # Children: the best distinct routes found (full-zone tours first). Parents: 0..3 random
        # edits of a child, a demonstration route or a child cut short (`shortcut_route`) that
        # score below every child.
        grid, budget = record_grid(record), record["budget"]

        def fitness(route):
            return float(np.mean(maze_world.route_reward(grid, budget, route)))

        demos = demo_routes(grid, budget, rng, 3)
        children = better_routes(grid, budget, rng, num_answers, fitness, demos)
        sources = children + [r for r in demos if r not in children] + [
            shortcut_route(grid, children[rng.integers(len(children))], rng) for _ in range(3)]
        parents = mutation_demos.weaker_parents(
            sources, fitness, min(map(fitness, children)), MOVES, rng,
            num_parents=num_parents, max_len=A, exclude=children)
        return [" ".join(p) for p in parents], [" ".join(c) for c in children]

    template = statement(grid_to_record(np.zeros((n, n), np.int8), 0)).split()
    words = sorted(set(template) | set(CELL_CHARS) | set(MOVES)
                   | {str(i) for i in range(A + 1)})
    return base.Task(
        name=f"maze{n}", reward_names=maze_world.REWARD_NAMES,
        eval_weights_R=np.full((4,), 0.25, np.float32), make_problems=make_problems,
        statement=statement, answer_hint=ANSWER_HINT, score=score, solved=solved,
        demonstrations=demonstrations, symbols=MOVES, answer_len=A, arrays=arrays,
        symbol_reward=symbol_reward, mutation_demonstrations=mutation_demonstrations,
        words=tuple(words), max_answers=max_answers)


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
    `wander` routes through a random open tile. If every draw repeats, the slot takes the first
    new route of a sweep with every open tile as the wander tile, then of earlier routes after
    wall bumps at S (same reward; a grid may have only two loop-free lava-free routes). If the
    budget leaves no room even for that, the slot repeats the first route (a duplicate).
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

    def fallback(routes: list[list[str]]):
        for i in rng.permutation(len(open_tiles)):  # each open tile as the `wander` waypoint
            try:
                yield maze_world.plan_route(grid, [open_tiles[i]], rng)
            except ValueError:
                continue
        room = budget - min(map(len, routes), default=budget)
        for j in range(1, room + 1):  # j bumps at S (U and L both stay put), then a route
            for bumps in itertools.product("UL", repeat=j):
                yield from (list(bumps) + r for r in routes)

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
        else:  # every draw repeated
            route = next((r for r in fallback(routes) if r not in routes and len(r) <= budget),
                         routes[0] if routes else route)
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
