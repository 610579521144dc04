"""The designed-conflict maze over text (the maze task of VPO, Bahlous-Boldi et al., arXiv
2605.22817).

World, generator and rules (the authors' `vpo_tasks/maze.py`): `vpo.tasks.maze_world`. Here: the
record and text formats, the jnp reward and the `Task` factory.

Record (JSON-able): `{"grid": ["S.#.g", ...], "budget": 14}`, one string per row and one char
per cell: `S` start, `E` exit, `#` wall, `.` floor, `g` gold, `d` diamond, `x` lava, `b` bonus
(`grid_to_record`, `record_grid`). Statement, cells and numbers as whitespace-separated words:

    Maze (S start, E exit, # wall, . floor, g gold, d diamond, x lava, b bonus):
    S . # . g
    ...
    Go from S to E in at most 14 moves; collect gold and diamonds; avoid lava; scores are
    squared fractions, x1.5 after b.

Answer: a route of moves `U D L R` separated by spaces, 1..A = answer_len of them (symbol id i
is move i in that order).

Reward, R = 4 (`maze_world.route_reward`): completion * (1, gold, diamond, avoid_lava) with the
fractions collected / total (avoid_lava = 1 - lava stepped / lava total) taken as they are
(`scoring="linear"`, the plain fractions) or, the default
and the authors' generated data, `scoring="convex_bonus"`: each fraction squared, x1.5 once the
centre bonus tile is visited, clamped to 1 (the VPO paper's maze scoring). completion = 1 iff the
route reaches E within the budget; items, lava and the bonus count only on tiles entered before E.
Wall bumps stay in place and cost a step. A route with a word that is not a move is invalid (zero
row; the authors skip such words), and so is an exact duplicate of an earlier route in the same
generation. w* = the mean of the four components.

Solved (pass@k): w*ᵀr >= 3/4, the value of a lava-free route that collects a whole zone, i.e.
the best a single-objective route can do given the designed conflict. Under convex_bonus a route
also gets there by mixing parts of both zones with the bonus (e.g. 2/3 of each: 1.5 (4/9) = 2/3
per zone, w*ᵀr = 5/6); under linear by any route with gold + diamond + avoid_lava >= 2. A
lava-free whole-zone route always fits the budget (generator invariant), so every instance is
solvable.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import base, maze_world, mutation_demos
from vpo.tasks.maze_world import BONUS, DIAMOND, EXIT, GOLD, LAVA, START, WALL

CELL_CHARS = ".#xgdSEb"  # CELL_CHARS[code] for the maze_world codes EMPTY..BONUS
MOVES = tuple(maze_world.MOVES)  # U D L R
ANSWER_HINT = "a route of moves U D L R separated by spaces"
SOLVED_SCORE = 0.75  # w*ᵀr of a lava-free full-zone route


class MazeArrays(NamedTuple):
    """grid: int8 [N, n, n] cell codes (maze_world.EMPTY..EXIT); budget: int32 [N] steps."""

    grid: np.ndarray
    budget: np.ndarray


def grid_to_record(grid: np.ndarray, budget: int) -> base.Record:
    """The JSON-able record of one maze: rows as strings of cell chars, and the budget."""
    return {"grid": ["".join(CELL_CHARS[int(v)] for v in row) for row in np.asarray(grid)],
            "budget": int(budget)}


def record_grid(record: base.Record) -> np.ndarray:
    """The int8 [n, n] cell codes of a record's grid."""
    rows = record["grid"]
    bad = sorted({ch for row in rows for ch in row if ch not in CELL_CHARS})
    if bad or any(len(row) != len(rows) for row in rows):
        raise ValueError(f"maze grid must be square rows of the cell chars {CELL_CHARS!r}; "
                         f"got rows {rows}")
    return np.array([[CELL_CHARS.index(ch) for ch in row] for row in rows], np.int8)


def statement(record: base.Record, scoring: str = "convex_bonus") -> str:
    """The maze as text: legend, one line of space-separated cells per row, the budget and the
    scoring rule."""
    rows = "\n".join(" ".join(row) for row in record["grid"])
    rule = ("collect all gold or all diamonds; avoid lava." if scoring == "linear" else
            "collect gold and diamonds; avoid lava; scores are squared fractions, x1.5 after b.")
    return ("Maze (S start, E exit, # wall, . floor, g gold, d diamond, x lava, b bonus):\n"
            + rows + f"\nGo from S to E in at most {int(record['budget'])} moves; {rule}")


def solved(rewards_R):
    """w*ᵀr >= 3/4 with w* uniform (jnp; numpy and batched inputs work); see the docstring."""
    return jnp.mean(jnp.asarray(rewards_R, jnp.float32), axis=-1) >= SOLVED_SCORE - 1e-6


def simulate_route(grid: jax.Array, budget: jax.Array, moves_A: jax.Array,
                   mask_A: jax.Array, scoring: str = "convex_bonus") -> jax.Array:
    """In-graph twin of `maze_world.route_reward` for one route (move indices 0..3 = U D L R).

    Returns rewards_R float32: (completion, gold, diamond, avoid_lava), gated on completion.
    """
    H, W = grid.shape
    dr_4 = jnp.array([-1, 1, 0, 0], jnp.int32)
    dc_4 = jnp.array([0, 0, -1, 1], jnp.int32)

    def step(carry, x):
        r, c, t, done, t_exit, visited = carry
        move, live = x
        active = live & ~done
        nr = r + dr_4[move]
        nc = c + dc_4[move]
        inside = (nr >= 0) & (nr < H) & (nc >= 0) & (nc < W)
        nr_c, nc_c = jnp.clip(nr, 0, H - 1), jnp.clip(nc, 0, W - 1)
        ok = inside & (grid[nr_c, nc_c] != WALL)
        r = jnp.where(active & ok, nr_c, r)
        c = jnp.where(active & ok, nc_c, c)
        t = t + active.astype(jnp.int32)
        visited = visited.at[r, c].set(visited[r, c] | active)
        arrive = active & (grid[r, c] == EXIT)
        return (r, c, t, done | arrive, jnp.where(arrive, t, t_exit), visited), None

    s = jnp.argmax((grid == START).reshape(-1)).astype(jnp.int32)
    init = (s // W, s % W, jnp.int32(0), jnp.bool_(False), jnp.int32(0),
            jnp.zeros((H, W), bool))
    (_, _, _, done, t_exit, visited), _ = jax.lax.scan(step, init, (moves_A, mask_A))
    completion = done & (t_exit <= budget)

    # got / total from a numpy-built table: XLA's CPU divide is not correctly rounded, numpy's
    # (the host's) is, and the two paths must agree bit for bit.
    ratio = jnp.asarray(maze_world.ratio_table(H * W))

    def frac(kind):
        is_kind = grid == kind
        return ratio[jnp.sum(is_kind & visited), jnp.sum(is_kind)], jnp.sum(is_kind)

    (gold, _), (diamond, _), (lava, n_lava) = map(frac, (GOLD, DIAMOND, LAVA))
    frac_3 = jnp.stack([gold, diamond, jnp.where(n_lava > 0, 1.0 - lava, 1.0)])
    bonus = jnp.any(visited & (grid == BONUS))
    scores_3 = maze_world.score_fractions(frac_3, bonus, scoring, xp=jnp)
    rewards_R = jnp.concatenate([jnp.ones((1,), jnp.float32), scores_3.astype(jnp.float32)])
    return jnp.where(completion, rewards_R, 0.0).astype(jnp.float32)


DEMOS = ("all", "partial")  # the demonstration sets of `make_maze_task(demos=...)`


def make_maze_task(size: int = 5, *, max_answers: int = 8, scoring: str = "convex_bonus",
                   demos: str = "all", **config) -> base.Task:
    """The maze `Task` on an odd `size` grid scored by `scoring` ("convex_bonus" or "linear",
    see the module docstring); `config` overrides `maze_world.MazeConfig` fields.

    `demos` picks the SFT demonstrations: "all" (`demo_routes`: every answer mode, full-zone
    tours included; mutation children are full-zone tours) or "partial" (`partial_routes`:
    routes that reach E but collect only part of one zone or none, none of them solved where the
    grid allows, in plain and mutation demonstrations alike), so that a warm start learns the
    answer format and leaves the solved routes for reward-driven training to find.

    The default (5x5, 2-3 items per zone within Manhattan radius 1, 1-2 lava tiles, budget
    slack 3, A = 16, fixed corners) is small enough for a tiny policy on CPU;
    `make_paper_maze_task()` is the 9x9 setting.
    """
    if scoring not in maze_world.SCORINGS:
        raise ValueError(f"maze scoring must be one of {maze_world.SCORINGS}; got {scoring!r}")
    if demos not in DEMOS:
        raise ValueError(f"maze demos must be one of {DEMOS}; got {demos!r}")
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
                              symbols_A, mask_A, scoring)

    def route_reward(grid, budget, route):
        return maze_world.route_reward(grid, budget, route, scoring)

    def score(records, answers):
        return base.score_symbol_answers(
            records, answers, MOVES, A, 4,
            lambda rec, words: route_reward(record_grid(rec), rec["budget"], words))

    def demonstrations(record, rng: np.random.Generator, num_answers: int) -> list[str]:
        grid, budget = record_grid(record), record["budget"]
        if demos == "partial":
            routes = partial_routes(grid, budget, rng, num_answers,
                                    lambda route: float(np.mean(route_reward(grid, budget, route))))
        else:
            routes = demo_routes(grid, budget, rng, num_answers)
        return [" ".join(r) for r in routes]

    def mutation_demonstrations(record, rng: np.random.Generator, num_parents: int,
                                num_answers: int) -> tuple[list[str], list[str]]:
        # Children: the best distinct routes found (full-zone tours first; with demos="partial"
        # the best of a few unsolved `partial_routes`, so no SFT row shows a solved route).
        # Parents: 0..3 random edits of a child, a demonstration route or a child cut short
        # (`shortcut_route`) that score below every child.
        grid, budget = record_grid(record), record["budget"]

        def fitness(route):
            return float(np.mean(route_reward(grid, budget, route)))

        if demos == "partial":
            found = partial_routes(grid, budget, rng, num_answers + 2, fitness)
            children = sorted(found, key=fitness, reverse=True)[:num_answers]
            demo_set = [r for r in found if r not in children]
        else:
            demo_set = demo_routes(grid, budget, rng, 3)
            children = better_routes(grid, budget, rng, num_answers, fitness, demo_set)
        sources = children + [r for r in demo_set if r not in children] + [
            shortcut_route(grid, children[rng.integers(len(children))], rng) for _ in range(3)]
        parents = mutation_demos.weaker_parents(
            sources, fitness, min(map(fitness, children)), MOVES, rng,
            num_parents=num_parents, max_len=A, exclude=children)
        return [" ".join(p) for p in parents], [" ".join(c) for c in children]

    template = statement(grid_to_record(np.zeros((n, n), np.int8), 0), scoring).split()
    words = sorted(set(template) | set(CELL_CHARS) | set(MOVES)
                   | {str(i) for i in range(A + 1)})
    return base.Task(
        name=f"maze{n}", reward_names=maze_world.REWARD_NAMES,
        eval_weights_R=np.full((4,), 0.25, np.float32), make_problems=make_problems,
        statement=functools.partial(statement, scoring=scoring), answer_hint=ANSWER_HINT,
        score=score, solved=solved,
        demonstrations=demonstrations, symbols=MOVES, answer_len=A, arrays=arrays,
        symbol_reward=symbol_reward, mutation_demonstrations=mutation_demonstrations,
        words=tuple(words), max_answers=max_answers)


# The paper's 9x9 setting (the authors' `_build_maze`): 3-5 items per zone within Manhattan
# radius 2, 3-5 lava tiles off the border band of width 2, slack 7, corners drawn; A = 40.
PAPER_CONFIG = dict(size=9, zone_radius=2, items=(3, 5), lava=(3, 5), open_frac=0.4, slack=7,
                    answer_len=40, random_corners=True)


def make_paper_maze_task(*, max_answers: int = 8, scoring: str = "convex_bonus") -> base.Task:
    """The paper's 9x9 maze `Task` (`PAPER_CONFIG`)."""
    return make_maze_task(max_answers=max_answers, scoring=scoring, **PAPER_CONFIG)


def demo_routes(grid: np.ndarray, budget: int, rng: np.random.Generator, num_answers: int,
                tries: int = 30) -> list[list[str]]:
    """`num_answers` distinct scoring routes, lava-free and within budget.

    Slots take the kinds via-gold, via-diamond and via-bonus (the bonus tile and a few items of
    either zone, the mix that convex_bonus rewards) in random order, then `part` routes that
    collect a random non-empty part of one zone. A slot whose kind only reproduces earlier
    routes (a unique shortest path may pass the gold zone) or overruns the budget falls back to
    `part` routes and to `wander` routes through a random open tile. If every draw repeats, the
    slot takes the first new route of a sweep with every open tile as the wander tile, then of
    earlier routes after wall bumps at S (same reward; a grid may have only two loop-free
    lava-free routes). If the budget leaves no room even for that, the slot repeats the first
    route (a duplicate).
    """
    gold, diamond = maze_world.zone_items(grid, GOLD), maze_world.zone_items(grid, DIAMOND)
    open_tiles = maze_world.zone_items(grid, maze_world.EMPTY)
    bonus = maze_world.zone_items(grid, BONUS)
    start = maze_world.endpoints(grid)[0]
    stay = "".join(m for m, (dr, dc) in maze_world.MOVES.items()  # moves off the grid at S
                   if not (0 <= start[0] + dr < len(grid) and 0 <= start[1] + dc < len(grid)))

    def waypoints(kind: str):
        if kind == "wander":
            return [open_tiles[rng.integers(len(open_tiles))]] if open_tiles else []
        if kind in ("gold", "diamond"):
            return maze_world.best_tour(grid, gold if kind == "gold" else diamond,
                                        avoid_lava=True)[1]
        if kind == "part":  # a random non-empty part of one zone
            pool = gold if rng.random() < 0.5 else diamond
            size = rng.integers(1, len(pool) + 1)
        else:  # "bonus": the bonus tile and 1..(larger zone) random items of either zone
            pool = gold + diamond
            size = rng.integers(1, max(len(gold), len(diamond)) + 1)
        keep = [pool[i] for i in sorted(rng.permutation(len(pool))[:size])]
        return maze_world.best_tour(grid, keep + (bonus if kind == "bonus" else []),
                                    avoid_lava=True)[1]

    def fallback(routes: list[list[str]]):
        for i in rng.permutation(len(open_tiles)):  # each open tile as the `wander` waypoint
            try:
                yield maze_world.plan_route(grid, [open_tiles[i]], rng)
            except ValueError:
                continue
        room = budget - min(map(len, routes), default=budget)
        for j in range(1, room + 1):  # j bumps into the border at S, then a route
            for bumps in itertools.product(stay, repeat=j):
                yield from (list(bumps) + r for r in routes)

    kinds = [str(k) for k in rng.permutation(["gold", "diamond", "bonus"])]
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


def partial_routes(grid: np.ndarray, budget: int, rng: np.random.Generator, num_answers: int,
                   fitness, tries: int = 30) -> list[list[str]]:
    """`num_answers` distinct lava-free routes S -> E within budget that are not solved
    (`fitness`, w*ᵀr, below `SOLVED_SCORE`): each collects a random proper part of one zone
    (`part`: 1 .. size - 1 of its items) or passes a random open tile (`wander`). A slot whose
    draws all repeat, overrun the budget or solve (a shortest path may sweep a whole zone) takes
    the first new unsolved route of a sweep with every open tile as the wander tile, then of
    earlier routes after wall bumps at S; if there is none (every route that fits solves), the
    lowest-scoring new one, else a duplicate of the first route."""
    zones = [z for z in (maze_world.zone_items(grid, GOLD), maze_world.zone_items(grid, DIAMOND))
             if len(z) > 1]
    open_tiles = maze_world.zone_items(grid, maze_world.EMPTY)
    start = maze_world.endpoints(grid)[0]
    stay = "".join(m for m, (dr, dc) in maze_world.MOVES.items()  # moves off the grid at S
                   if not (0 <= start[0] + dr < len(grid) and 0 <= start[1] + dc < len(grid)))

    def draw(kind: str):
        if kind == "part" and zones:
            pool = zones[rng.integers(len(zones))]
            size = rng.integers(1, len(pool))
            keep = [pool[i] for i in sorted(rng.permutation(len(pool))[:size])]
            waypoints = maze_world.best_tour(grid, keep, avoid_lava=True)[1]
        else:
            waypoints = [open_tiles[rng.integers(len(open_tiles))]] if open_tiles else []
        return maze_world.plan_route(grid, waypoints, rng)

    def fallback(drawn: list[list[str]], routes: list[list[str]]):
        for i in rng.permutation(len(open_tiles)):
            try:
                yield maze_world.plan_route(grid, [open_tiles[i]], rng)
            except ValueError:
                continue
        base = drawn + routes
        room = budget - min(map(len, base), default=budget)
        for j in range(1, min(room, 3) + 1):  # j bumps into the border at S, then a route
            for bumps in itertools.product(stay, repeat=j):
                yield from (list(bumps) + r for r in base)

    routes: list[list[str]] = []
    for _ in range(num_answers):
        drawn: list[list[str]] = []
        for attempt in range(tries):
            try:
                route = draw("wander" if attempt % 2 else "part")
            except ValueError:  # no lava-free route through the drawn tiles
                continue
            if route not in routes and len(route) <= budget:
                if fitness(route) < SOLVED_SCORE:
                    break
                drawn.append(route)
        else:
            new = [r for r in fallback(drawn, routes) if r not in routes and len(r) <= budget]
            route = next((r for r in new if fitness(r) < SOLVED_SCORE),
                         min(new, key=fitness) if new else (routes or drawn or [[]])[0])
        routes.append(route)
    return routes


def better_routes(grid: np.ndarray, budget: int, rng: np.random.Generator, num_answers: int,
                  fitness, fallback: list[list[str]], tries: int = 6) -> list[list[str]]:
    """`num_answers` distinct routes, best first: lava-free full tours of the gold and of the
    diamond zone that fit the budget (at least one does; each scores w*ᵀr >= 3/4, see `solved`)
    with random shortest legs, topped up with the best `fallback` routes when the tours have
    too few distinct variants."""
    tours = [maze_world.best_tour(grid, maze_world.zone_items(grid, kind), avoid_lava=True)
             for kind in (GOLD, DIAMOND)]
    orders = [order for steps, order in tours if steps <= budget]
    found: list[list[str]] = []
    for t in range(tries * num_answers if orders else 0):
        route = maze_world.plan_route(grid, orders[t % len(orders)], rng)
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
    pos, exit_ = maze_world.endpoints(grid)
    for m in route[:k]:
        nr, nc = pos[0] + maze_world.MOVES[m][0], pos[1] + maze_world.MOVES[m][1]
        if 0 <= nr < n and 0 <= nc < n and grid[nr, nc] != WALL:
            pos = (nr, nc)
    inverse = {d: m for m, d in maze_world.MOVES.items()}
    out, cur = list(route[:k]), pos
    try:
        path = maze_world._random_path(grid, pos, exit_, rng,
                                       avoid_lava=bool(rng.random() < 0.5))
    except ValueError:
        return out
    for nxt in path:
        out.append(inverse[(nxt[0] - cur[0], nxt[1] - cur[1])])
        cur = nxt
    return out
