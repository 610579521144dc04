"""Host-side maze world: procedural generation, shortest routes, and a plain-Python reward.

The designed-conflict maze of VPO (Bahlous-Boldi et al., arXiv 2605.22817), with the rules of
the authors' generator and scorer (ryanboldi/vpo `vpo_tasks/maze.py`, `_build_maze` and
`score_trajectory`):

- Corners: start S and exit E on opposite corners, the gold and the diamond zone around the other
  two (with `random_corners`, the diagonal of S/E and the gold/diamond assignment are drawn, as
  the authors do; otherwise S top-left, E bottom-right, gold top-right, diamond bottom-left).
  The centre tile (n//2, n//2) is the bonus tile b.
- Budget and conflict, from shortest routes to the corner cells through any non-wall tile (the
  carved grid, before items and lava): `via_X = d(S, X) + d(X, E)` for the gold and diamond
  corners, `budget = max(via_gold, via_diamond) + slack`; an instance is kept only if
  `d(S, gold) + d(gold, diamond) + d(diamond, E) > budget` (the gold-first order only, as in
  their `via_gold_then_diam`), and S -> E, S -> centre and centre -> E are reachable.
- Zones: items on open tiles within Manhattan distance `zone_radius` of their corner (corner
  included), `items` per zone drawn in [lo, min(hi, #open tiles)], at least `lo` open tiles
  required. Lava: `lava` tiles on open tiles with both coordinates in [zone_radius,
  n - zone_radius) (their interior `range(2, size - 2)` at radius 2). Kept only if a lava-free
  S -> E route fits the budget (their `d_safe`).
- Our additions: the budget fits the answer length A, and a lava-free route collecting a whole
  zone fits the budget, so a route reaching w*ᵀr = 3/4 (`maze.solved`) always exists.
- Walls: a randomized Prim maze on the cells at even coordinates with a fraction `open_frac` of
  the other walls between cells knocked out (the authors carve a Prim maze on all tiles, then
  open 18-28 walls).

Routes: a move sequence over U/D/L/R. Each move costs one step; a move into a wall or off the
grid leaves the agent in place (still one step). The episode ends the first time the agent steps
on E; only moves up to the budget count, and items, lava and the bonus tile count only on tiles
entered before E.

Reward (`route_reward`), R = 4, all zeros unless E is reached within the budget:
    linear:        (1, g, d, s),   g = gold_got / gold_total, d = diamonds_got / diamond_total,
                                   s = 1 - lava_hit / lava_total (1 without lava)
    convex_bonus:  (1, min(1, b g²), min(1, b d²), min(1, b s²)),   b = 1.5 if the bonus tile
                   was visited else 1   (the authors' generated data use this mode)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque

import numpy as np

EMPTY, WALL, LAVA, GOLD, DIAMOND, START, EXIT, BONUS = range(8)
CELL_NAMES = ("empty", "wall", "lava", "gold", "diamond", "start", "exit", "bonus")
MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
REWARD_NAMES = ("completion", "gold", "diamond", "avoid_lava")
SCORINGS = ("convex_bonus", "linear")
BONUS_FACTOR = 1.5  # convex_bonus: item and lava scores x1.5 once the bonus tile is visited


@dataclasses.dataclass(frozen=True)
class MazeConfig:
    """Generator settings (see the module docstring). `size` must be odd and >= 5."""

    size: int = 5
    zone_radius: int = 1  # Manhattan radius of a zone around its corner
    items: tuple[int, int] = (2, 3)  # items per zone, inclusive range
    lava: tuple[int, int] = (1, 2)  # lava tiles, inclusive range
    open_frac: float = 0.5  # fraction of the non-tree walls between cells removed
    slack: int | None = None  # budget slack; None -> size - 2 (the paper's 7 at 9x9)
    answer_len: int | None = None  # A, the longest route; None -> 4 * (size - 1)
    random_corners: bool = False  # draw the S/E diagonal and the gold/diamond corners
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
        if not 1 <= self.zone_radius < self.size // 2:
            raise ValueError(f"maze zone_radius must be in [1, size // 2); got {self.zone_radius}")
        if not 0.0 <= self.open_frac <= 1.0:
            raise ValueError(f"maze open_frac must be in [0, 1]; got {self.open_frac}")


def corners(n: int) -> dict[str, tuple[int, int]]:
    """The fixed corner of each role on an n x n grid (`random_corners=False`)."""
    return {"start": (0, 0), "exit": (n - 1, n - 1), "gold": (0, n - 1), "diamond": (n - 1, 0)}


def draw_corners(rng: np.random.Generator, n: int) -> dict[str, tuple[int, int]]:
    """The authors' corner draw: S/E on a random diagonal, gold/diamond shuffled on the other."""
    diagonals = (((0, 0), (n - 1, n - 1)), ((0, n - 1), (n - 1, 0)))
    start, exit_ = diagonals[rng.integers(2)]
    others = [c for c in ((0, 0), (0, n - 1), (n - 1, 0), (n - 1, n - 1))
              if c not in (start, exit_)]
    gold, diamond = (others[i] for i in rng.permutation(2))
    return {"start": start, "exit": exit_, "gold": gold, "diamond": diamond}


def centre(n: int) -> tuple[int, int]:
    """The bonus tile."""
    return (n // 2, n // 2)


def endpoints(grid: np.ndarray) -> tuple[tuple[int, int], tuple[int, int]]:
    """(S, E) positions of a grid."""
    (s,), (e,) = (list(map(tuple, np.argwhere(grid == k).tolist())) for k in (START, EXIT))
    return s, e


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
    start, exit_ = endpoints(grid)
    pts = [start, *items, exit_]
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


def _steps(grid: np.ndarray, a: tuple[int, int], b: tuple[int, int]) -> int:
    """Shortest steps a -> b through non-wall tiles (-1: unreachable), the authors' `_bfs_path`."""
    return int(_bfs(grid, a, avoid_lava=False, blocked_exit=False)[b])


def corner_budget(grid: np.ndarray, cs: dict[str, tuple[int, int]], slack: int
                  ) -> tuple[int, int] | None:
    """(budget, gold-then-diamond detour) from routes to the corner cells, or None when S -> E,
    S -> a zone corner -> E or S -> centre -> E is impossible (see the module docstring)."""
    s, e, g, d = cs["start"], cs["exit"], cs["gold"], cs["diamond"]
    legs = [(s, e), (s, g), (g, e), (s, d), (d, e), (s, centre(grid.shape[0])),
            (centre(grid.shape[0]), e), (g, d)]
    dist = {ab: _steps(grid, *ab) for ab in legs}
    if min(dist.values()) < 0:
        return None
    budget = max(dist[s, g] + dist[g, e], dist[s, d] + dist[d, e]) + slack
    return budget, dist[s, g] + dist[g, d] + dist[d, e]


def _place_items(rng: np.random.Generator, grid: np.ndarray, tiles: list[tuple[int, int]],
                 counts: tuple[int, int], kind: int) -> None:
    """`kind` on a random k of `tiles` (len >= counts[0]), k uniform in [lo, min(hi, len)]."""
    k = int(rng.integers(counts[0], min(counts[1], len(tiles)) + 1))
    for i in rng.permutation(len(tiles))[:k]:
        grid[tiles[i]] = kind


def generate(rng: np.random.Generator, cfg: MazeConfig) -> tuple[np.ndarray, int]:
    """One (grid int8, budget) instance by rejection sampling (see the module docstring)."""
    n, r = cfg.size, cfg.zone_radius
    for _ in range(cfg.max_tries):
        grid = _carve(rng, n, cfg.open_frac)
        cs = draw_corners(rng, n) if cfg.random_corners else corners(n)
        for tile in (*cs.values(), centre(n)):
            grid[tile] = EMPTY
        found = corner_budget(grid, cs, cfg.slack)
        if found is None or found[1] <= found[0] or found[0] > cfg.answer_len:
            continue
        budget = found[0]
        grid[cs["start"]], grid[cs["exit"]], grid[centre(n)] = START, EXIT, BONUS
        zones = [[t for t in zone_items(grid, EMPTY)
                  if abs(t[0] - cs[name][0]) + abs(t[1] - cs[name][1]) <= r]
                 for name in ("gold", "diamond")]
        if min(map(len, zones)) < cfg.items[0]:
            continue
        for kind, zone in zip((GOLD, DIAMOND), zones, strict=True):
            _place_items(rng, grid, zone, cfg.items, kind)
        inner = [t for t in zone_items(grid, EMPTY) if r <= min(t) and max(t) < n - r]
        n_lava = min(int(rng.integers(cfg.lava[0], cfg.lava[1] + 1)), len(inner))
        for i in rng.permutation(len(inner))[:n_lava]:
            grid[inner[i]] = LAVA
        d_safe = _dist_to(grid, cs["exit"], avoid_lava=True)[cs["start"]]
        if not 0 <= d_safe <= budget:
            continue
        tours = [best_tour(grid, zone_items(grid, kind), avoid_lava=True)[0]
                 for kind in (GOLD, DIAMOND)]
        if min(tours) > budget:
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
    start, exit_ = endpoints(grid)
    cells = [start, *waypoints, exit_]
    moves, cur = [], cells[0]
    inverse = {d: m for m, d in MOVES.items()}
    for target in cells[1:]:
        for nxt in _random_path(grid, cur, target, rng, avoid_lava=True):
            moves.append(inverse[(nxt[0] - cur[0], nxt[1] - cur[1])])
            cur = nxt
    return moves


def ratio_table(n: int) -> np.ndarray:
    """[n + 1, n + 1] float32: entry (k, d) = k / d correctly rounded (0 where d = 0), the
    fractions of `route_reward` as a lookup for the in-graph twin."""
    k = np.arange(n + 1, dtype=np.float32)
    return k[:, None] / np.maximum(k, np.float32(1))[None, :]


def score_fractions(frac_3, bonus, scoring: str, xp=np):
    """(gold, diamond, safe) fractions -> the last three reward components under `scoring`:
    linear keeps them, convex_bonus gives min(1, b f²) with b = 1.5 if `bonus` else 1 (the
    authors' `score_trajectory`). `xp` is np or jnp: host and graph share these float32 ops."""
    if scoring == "linear":
        return frac_3
    if scoring != "convex_bonus":
        raise ValueError(f"maze scoring must be one of {SCORINGS}; got {scoring!r}")
    mult = xp.where(bonus, xp.float32(BONUS_FACTOR), xp.float32(1.0))
    return xp.minimum(mult * (frac_3 * frac_3), xp.float32(1.0))


def route_reward(grid: np.ndarray, budget: int, moves: list[str], scoring: str = "convex_bonus"
                 ) -> tuple[float, ...]:
    """Plain-Python reward of one route: (completion, gold, diamond, avoid_lava), gated on E
    (module docstring). The reference for the in-graph `maze.simulate_route`, with the same
    float32 arithmetic; a route with a non-move word scores 0."""
    if any(m not in MOVES for m in moves):
        return (0.0, 0.0, 0.0, 0.0)
    n = grid.shape[0]
    pos, visited, exit_step = endpoints(grid)[0], set(), None
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

    def frac(kind):  # float32 got / total, 0 without any (as `ratio_table`)
        got, total = sum(grid[p] == kind for p in visited), int(np.sum(grid == kind))
        return np.float32(got) / np.float32(max(total, 1)), total

    (gold, _), (diamond, _), (lava, n_lava) = map(frac, (GOLD, DIAMOND, LAVA))
    frac_3 = np.array([gold, diamond, np.float32(1) - lava if n_lava else 1.0], np.float32)
    bonus = any(grid[p] == BONUS for p in visited)
    return (1.0, *(float(v) for v in score_fractions(frac_3, bonus, scoring)))
