"""Host-side maze world: procedural generation, shortest routes, and a plain-Python reward.

The designed-conflict maze of VPO (arXiv 2605.22817; digest §1.4, Maze row), on a tile grid:
start S and exit E in opposite corners (top-left, bottom-right), a gold zone around the top-right
corner and a diamond zone around the bottom-left corner (items on open tiles within Chebyshev
radius `zone_radius` of the corner), and lava tiles elsewhere. Walls come from a randomized Prim
maze (open cells at even coordinates) with a fraction `open_frac` of the remaining walls between
cells knocked out to make cycles.

Routes: a route is a move sequence over U/D/L/R. Each move costs one step; a move into a wall or
off the grid leaves the agent in place (still one step). The episode ends the first time the agent
steps on E; items and lava count only on tiles entered before that, moves after it are ignored.

Budget (digest §1.4): `via_X` = the shortest route from S that collects ALL items of zone X and
then reaches E, avoiding lava; `budget = max(via_gold, via_diamond) + slack`. An instance is kept
only if (1) both via routes exist, (2) the shortest route collecting all gold AND all diamonds
(lava allowed) is longer than the budget, and (3) budget <= answer_len. So either zone fits, both
never do, and a lava-free full-zone route (what `solved` asks for) always exists.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque

import numpy as np

EMPTY, WALL, LAVA, GOLD, DIAMOND, START, EXIT = range(7)
CELL_NAMES = ("empty", "wall", "lava", "gold", "diamond", "start", "exit")
MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
REWARD_NAMES = ("completion", "gold", "diamond", "avoid_lava")


@dataclasses.dataclass(frozen=True)
class MazeConfig:
    """Generator settings (see the module docstring). `size` must be odd and >= 5."""

    size: int = 5
    zone_radius: int = 1
    items: tuple[int, int] = (2, 3)  # items per zone, inclusive range
    lava: tuple[int, int] = (1, 2)  # lava tiles, inclusive range
    open_frac: float = 0.5  # fraction of the non-tree walls between cells removed
    slack: int | None = None  # budget slack; None -> size - 2 (the paper's 7 at 9x9)
    answer_len: int | None = None  # A, the longest route; None -> 4 * (size - 1)
    max_tries: int = 2000  # rejection-sampling attempts per instance

    def __post_init__(self):
        if self.size < 5 or self.size % 2 == 0:
            raise ValueError(f"maze size must be odd and >= 5 (cells sit at even coordinates); "
                             f"got {self.size}")
        if self.slack is None:
            object.__setattr__(self, "slack", self.size - 2)
        if self.answer_len is None:
            object.__setattr__(self, "answer_len", 4 * (self.size - 1))
        for name in ("items", "lava"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"maze {name}=({lo}, {hi}) must satisfy 0 <= lo <= hi")
        if self.items[0] < 1:
            raise ValueError("maze items: each zone needs at least one item (items[0] >= 1)")
        if not 0.0 <= self.open_frac <= 1.0:
            raise ValueError(f"maze open_frac must be in [0, 1]; got {self.open_frac}")


def corners(n: int) -> dict[str, tuple[int, int]]:
    """Corner of each role on an n x n grid."""
    return {"start": (0, 0), "exit": (n - 1, n - 1), "gold": (0, n - 1), "diamond": (n - 1, 0)}


def _carve(rng: np.random.Generator, n: int, open_frac: float) -> np.ndarray:
    """Randomized Prim on the cells at even coordinates, plus a fraction of extra openings."""
    grid = np.full((n, n), WALL, np.int8)
    cells = [(r, c) for r in range(0, n, 2) for c in range(0, n, 2)]
    first = cells[rng.integers(len(cells))]
    grid[first] = EMPTY
    seen = {first}
    frontier = [(first, d) for d in MOVES.values()]
    while frontier:
        (r, c), (dr, dc) = frontier.pop(rng.integers(len(frontier)))
        nr, nc = r + 2 * dr, c + 2 * dc
        if not (0 <= nr < n and 0 <= nc < n) or (nr, nc) in seen:
            continue
        grid[r + dr, c + dc] = EMPTY
        grid[nr, nc] = EMPTY
        seen.add((nr, nc))
        frontier.extend(((nr, nc), d) for d in MOVES.values())
    between = [(r, c) for r in range(n) for c in range(n)
               if (r + c) % 2 == 1 and grid[r, c] == WALL]
    n_open = int(round(open_frac * len(between)))
    for i in rng.permutation(len(between))[:n_open]:
        grid[between[i]] = EMPTY
    return grid


def _bfs(grid: np.ndarray, src: tuple[int, int], *, avoid_lava: bool, blocked_exit: bool
         ) -> np.ndarray:
    """Step distances from src (-1 where unreachable); walls always block."""
    n = grid.shape[0]
    blocked = grid == WALL
    if avoid_lava:
        blocked = blocked | (grid == LAVA)
    if blocked_exit:
        blocked = blocked | (grid == EXIT)
    dist = np.full((n, n), -1, np.int64)
    dist[src] = 0
    queue = deque([src])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and dist[nr, nc] < 0 and not blocked[nr, nc]:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def _dist_to(grid, b, *, avoid_lava: bool) -> np.ndarray:
    """Steps from every tile to b along routes that do not cross E before arriving (-1: none)."""
    return _bfs(grid, b, avoid_lava=avoid_lava, blocked_exit=grid[b] != EXIT)


def best_tour(grid: np.ndarray, items: list[tuple[int, int]], *, avoid_lava: bool
              ) -> tuple[int, list[tuple[int, int]]]:
    """(steps, item order) of the shortest route S -> all `items` (any order) -> E.

    Held-Karp over the items on leg distances that never cross E early; inf steps if impossible.
    """
    n = grid.shape[0]
    pts = [corners(n)["start"], *items, corners(n)["exit"]]
    k = len(items)
    inf = np.iinfo(np.int32).max
    to_b = [_dist_to(grid, b, avoid_lava=avoid_lava) for b in pts]
    D = [[int(t[a]) if t[a] >= 0 else inf for t in to_b] for a in pts]
    if k == 0:
        return D[0][1], []
    # dp[(mask, j)] = (cost, prev) of S -> the items in mask, ending at item j.
    dp: dict[tuple[int, int], tuple[int, int]] = {(1 << j, j): (D[0][1 + j], -1) for j in range(k)}
    for size in range(2, k + 1):
        for subset in itertools.combinations(range(k), size):
            mask = sum(1 << j for j in subset)
            for j in subset:
                prev_mask = mask & ~(1 << j)
                dp[(mask, j)] = min(((dp[(prev_mask, i)][0] + D[1 + i][1 + j], i)
                                     for i in subset if i != j), default=(inf, -1))
    full = (1 << k) - 1
    cost, last = min((dp[(full, j)][0] + D[1 + j][k + 1], j) for j in range(k))
    if cost >= inf:
        return inf, []
    order, mask = [], full
    while last >= 0:
        order.append(items[last])
        mask, last = mask & ~(1 << last), dp[(mask, last)][1]
    return cost, order[::-1]


def zone_items(grid: np.ndarray, kind: int) -> list[tuple[int, int]]:
    """Tiles of one cell kind, row-major."""
    return [tuple(int(v) for v in rc) for rc in np.argwhere(grid == kind)]


def generate(rng: np.random.Generator, cfg: MazeConfig) -> tuple[np.ndarray, int]:
    """One (grid_HW int8, budget) instance by rejection sampling (see the module docstring)."""
    n = cfg.size
    cs = corners(n)
    for _ in range(cfg.max_tries):
        grid = _carve(rng, n, cfg.open_frac)
        grid[cs["start"]], grid[cs["exit"]] = START, EXIT
        for kind, corner in ((GOLD, cs["gold"]), (DIAMOND, cs["diamond"])):
            cands = [(r, c) for r in range(n) for c in range(n)
                     if grid[r, c] == EMPTY and max(abs(r - corner[0]), abs(c - corner[1]))
                     <= cfg.zone_radius]
            k = min(int(rng.integers(cfg.items[0], cfg.items[1] + 1)), len(cands))
            for i in rng.permutation(len(cands))[:k]:
                grid[cands[i]] = kind
        empties = zone_items(grid, EMPTY)
        n_lava = min(int(rng.integers(cfg.lava[0], cfg.lava[1] + 1)), len(empties))
        for i in rng.permutation(len(empties))[:n_lava]:
            grid[empties[i]] = LAVA
        gold, diamond = zone_items(grid, GOLD), zone_items(grid, DIAMOND)
        if not gold or not diamond:
            continue
        via_gold = best_tour(grid, gold, avoid_lava=True)[0]
        via_diamond = best_tour(grid, diamond, avoid_lava=True)[0]
        budget = max(via_gold, via_diamond) + cfg.slack
        if budget > cfg.answer_len:  # also rejects unreachable (inf) tours
            continue
        if best_tour(grid, gold + diamond, avoid_lava=False)[0] <= budget:
            continue
        return grid, budget
    raise RuntimeError(f"no maze satisfying the budget conflict in {cfg.max_tries} tries for "
                       f"{cfg}; loosen slack/answer_len/items or raise max_tries")


def _random_path(grid, a, b, rng, *, avoid_lava: bool) -> list[tuple[int, int]]:
    """A uniformly tie-broken shortest path a -> b (cells after a), never crossing E early."""
    dist = _dist_to(grid, b, avoid_lava=avoid_lava)
    if dist[a] < 0:
        raise ValueError(f"no path from {a} to {b}")
    n, path, cur = grid.shape[0], [], a
    while cur != b:
        nxt = [(cur[0] + dr, cur[1] + dc) for dr, dc in MOVES.values()]
        nxt = [p for p in nxt if 0 <= p[0] < n and 0 <= p[1] < n and dist[p] == dist[cur] - 1]
        cur = nxt[rng.integers(len(nxt))]
        path.append(cur)
    return path


def plan_route(grid: np.ndarray, waypoints: list[tuple[int, int]], rng: np.random.Generator
               ) -> list[str]:
    """Moves of a lava-free route S -> waypoints (in order) -> E with random shortest legs."""
    n = grid.shape[0]
    cells = [corners(n)["start"], *waypoints, corners(n)["exit"]]
    moves, cur = [], cells[0]
    inverse = {d: m for m, d in MOVES.items()}
    for target in cells[1:]:
        for nxt in _random_path(grid, cur, target, rng, avoid_lava=True):
            moves.append(inverse[(nxt[0] - cur[0], nxt[1] - cur[1])])
            cur = nxt
    return moves


def route_reward(grid: np.ndarray, budget: int, moves: list[str]) -> tuple[float, ...]:
    """Plain-Python reward of one route: (completion, gold, diamond, avoid_lava), gated on E.

    The reference for the in-graph `maze.simulate_route`; a route with a non-move word scores 0.
    """
    if any(m not in MOVES for m in moves):
        return (0.0, 0.0, 0.0, 0.0)
    n = grid.shape[0]
    pos, visited, exit_step = corners(n)["start"], set(), None
    for step, m in enumerate(moves, start=1):
        dr, dc = MOVES[m]
        nr, nc = pos[0] + dr, pos[1] + dc
        if 0 <= nr < n and 0 <= nc < n and grid[nr, nc] != WALL:
            pos = (nr, nc)
        visited.add(pos)
        if grid[pos] == EXIT:
            exit_step = step
            break
    if exit_step is None or exit_step > budget:
        return (0.0, 0.0, 0.0, 0.0)

    def frac(kind):
        total = int(np.sum(grid == kind))
        return sum(grid[p] == kind for p in visited) / total if total else 0.0

    n_lava = int(np.sum(grid == LAVA))
    return (1.0, frac(GOLD), frac(DIAMOND), 1.0 - frac(LAVA) if n_lava else 1.0)
