"""A plain-Python port of the VPO authors' maze rules (ryanboldi/vpo `vpo_tasks/maze.py`:
`simulate`, `score_trajectory`, `_bfs_path`, `_zone`, `_build_maze`, `_build_record`), written
over this project's record format ({"grid": rows of cell chars, "budget": steps}) and used only
by tests/tasks/test_tasks_maze.py to check `vpo.tasks.maze_world` / `vpo.tasks.maze`.

Kept deliberately naive (dicts, lists, float64, no numpy) so it shares no code with the package.
"""

from __future__ import annotations

import itertools
from collections import deque

START, EXIT, WALL, GOLD, DIAMOND, LAVA, BONUS = "S", "E", "#", "g", "d", "x", "b"
ITEMS = (GOLD, DIAMOND, LAVA, BONUS)
DIRECTIONS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def find(rows: list[str], ch: str) -> list[tuple[int, int]]:
    """Positions of a cell char, row-major."""
    return [(r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x == ch]


def simulate(rows: list[str], moves: list[str], max_steps: int) -> dict:
    """The authors' `simulate`: walls and the border block (a bump costs a step), at most
    `max_steps` moves, the walk ends on E, items are the distinct item tiles entered before E."""
    (r, c), = find(rows, START)
    size = len(rows)
    visited, reached = set(), False
    for move in moves[:max_steps]:
        dr, dc = DIRECTIONS[move]
        if 0 <= r + dr < size and 0 <= c + dc < size and rows[r + dr][c + dc] != WALL:
            r, c = r + dr, c + dc
        if rows[r][c] == EXIT:
            reached = True
            break
        if rows[r][c] in ITEMS:
            visited.add((r, c))
    got = {ch: sum(rows[p[0]][p[1]] == ch for p in visited) for ch in ITEMS}
    return {"reached_end": reached, **got}


def score_trajectory(sim: dict, num_gold: int, num_diamond: int, num_lava: int,
                     score_mode: str) -> list[float]:
    """The authors' `score_trajectory`: [completion, gold, diamond, avoid_lava]."""
    if not sim["reached_end"]:
        return [0.0] * 4
    gold = sim[GOLD] / num_gold if num_gold > 0 else 0.0
    diamond = sim[DIAMOND] / num_diamond if num_diamond > 0 else 0.0
    safe = 1.0 - sim[LAVA] / num_lava if num_lava > 0 else 1.0
    if score_mode == "convex_bonus":
        mult = 1.5 if sim[BONUS] > 0 else 1.0
        gold, diamond, safe = mult * gold ** 2, mult * diamond ** 2, mult * safe ** 2
    return [1.0] + [max(0.0, min(1.0, v)) for v in (gold, diamond, safe)]


def reward(record: dict, moves: list[str], score_mode: str) -> list[float]:
    """The authors' `score_route` on a well-formed route of U/D/L/R."""
    rows = record["grid"]
    sim = simulate(rows, moves, record["budget"])
    return score_trajectory(sim, len(find(rows, GOLD)), len(find(rows, DIAMOND)),
                            len(find(rows, LAVA)), score_mode)


def steps(rows: list[str], a, b, avoid=()) -> float:
    """Length of the authors' `_bfs_path` a -> b (walls and `avoid` block), inf if none."""
    size = len(rows)
    dist = {a: 0}
    queue = deque([a])
    while queue:
        r, c = queue.popleft()
        if (r, c) == b:
            return dist[(r, c)]
        for dr, dc in DIRECTIONS.values():
            p = (r + dr, c + dc)
            if (0 <= p[0] < size and 0 <= p[1] < size and rows[p[0]][p[1]] != WALL
                    and p not in avoid and p not in dist):
                dist[p] = dist[(r, c)] + 1
                queue.append(p)
    return float("inf")


def zone(corner, size: int, radius: int) -> list[tuple[int, int]]:
    """The authors' `_zone`: tiles within Manhattan distance `radius` of a corner."""
    return [(r, c) for r in range(size) for c in range(size)
            if abs(r - corner[0]) + abs(c - corner[1]) <= radius]


def facts(record: dict, radius: int) -> dict:
    """What `_build_maze` / `_build_record` compute for one instance, recovered from its grid:
    the corners (a zone's corner: the free corner whose zone holds all its items), the corner
    routes (measured on the grid with items, lava and the bonus as open tiles, i.e. the carved
    maze they were measured on), the budget rule's inputs and the lava-free S -> E distance."""
    rows, size = record["grid"], len(record["grid"])
    (s,), (e,) = find(rows, START), find(rows, EXIT)
    free = [c for c in ((0, 0), (0, size - 1), (size - 1, 0), (size - 1, size - 1))
            if c not in (s, e)]
    out = {"start": s, "exit": e, "centre": (size // 2, size // 2)}
    for name, ch in (("gold", GOLD), ("diamond", DIAMOND)):
        homes = [c for c in free if set(find(rows, ch)) <= set(zone(c, size, radius))]
        out[name] = homes[0] if len(homes) == 1 else None
    g, d, m = out["gold"], out["diamond"], out["centre"]
    out["via_gold"] = steps(rows, s, g) + steps(rows, g, e)
    out["via_diam"] = steps(rows, s, d) + steps(rows, d, e)
    out["via_center"] = steps(rows, s, m) + steps(rows, m, e)
    out["via_gold_then_diam"] = steps(rows, s, g) + steps(rows, g, d) + steps(rows, d, e)
    out["d_safe"] = steps(rows, s, e, avoid=set(find(rows, LAVA)))
    return out


def full_zone_steps(record: dict, ch: str) -> float:
    """Fewest moves of a lava-free route S -> every `ch` item (any order) -> E that enters E only
    at its end (this project's solvability rule), by brute force over item orders."""
    rows = record["grid"]
    (s,), (e,) = find(rows, START), find(rows, EXIT)
    items, lava = find(rows, ch), set(find(rows, LAVA))
    leg = {(a, b): steps(rows, a, b, avoid=lava | ({e} if b != e else set()))
           for a in (s, *items) for b in (*items, e) if a != b}
    return min(sum(leg[ab] for ab in zip((s, *order), (*order, e), strict=True))
               for order in itertools.permutations(items))
