"""Maze: generator invariants and scores against a plain-Python port of the VPO authors' rules
(tests/tasks/maze_reference.py), records and text, hand-written routes, in-graph reward == host."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tasks import maze_reference as ref
from vpo.tasks import answers, base, maze, maze_world
from vpo.tasks.maze_world import BONUS, DIAMOND, EMPTY, EXIT, GOLD, LAVA, START, WALL

# A hand-made 5x5 maze (budget 11):      S . . g g
#                                         . # x # g
#                                         . . b . .
#                                         d # . # .
#                                         d d . . E
_ = EMPTY
GRID = np.array([[START, _, _, GOLD, GOLD],
                 [_, WALL, LAVA, WALL, GOLD],
                 [_, _, BONUS, _, _],
                 [DIAMOND, WALL, _, WALL, _],
                 [DIAMOND, DIAMOND, _, _, EXIT]], np.int8)
BUDGET = 11
RECORD = {"grid": ["S..gg", ".#x#g", "..b..", "d#.#.", "dd..E"], "budget": BUDGET}
SCORINGS = maze_world.SCORINGS  # convex_bonus (the default), linear


@pytest.fixture(scope="module")
def task():
    return maze.make_maze_task()


@jax.jit
def simulate_both(grid_NHW, budget_N, moves_NKA, mask_NKA):
    """rewards_NKSR of `maze.simulate_route` under each of SCORINGS (one compile per shape)."""
    def one(grid, budget, moves_A, mask_A):
        return jnp.stack([maze.simulate_route(grid, budget, moves_A, mask_A, s)
                          for s in SCORINGS])
    return jax.vmap(jax.vmap(one, in_axes=(None, None, 0, 0)))(
        grid_NHW, budget_N, moves_NKA, mask_NKA)


def _routes_to_arrays(routes, A):
    moves = np.zeros((len(routes), A), np.int32)
    mask = np.zeros((len(routes), A), bool)
    for i, r in enumerate(routes):
        moves[i, :len(r)] = ["UDLR".index(m) for m in r]
        mask[i, :len(r)] = True
    return moves, mask


HAND_ROUTES = {  # route -> (completion, gold, diamond, avoid_lava) under (linear, convex_bonus)
    "RRRRDDDD": ((1, 1, 0, 1),) * 2,  # along the gold zone
    "DDDDRRRR": ((1, 0, 1, 1),) * 2,  # along the diamond zone
    "RRDDRRDD": ((1, 0, 0, 0),) * 2,  # through the single lava tile, then the bonus
    "UUURRRRDDDD": ((1, 1, 0, 1),) * 2,  # 3 bumps into the border: arrives exactly at the budget
    "UUUURRRRDDDD": ((0, 0, 0, 0),) * 2,  # one bump more: arrives after the budget
    "RRR": ((0, 0, 0, 0),) * 2,  # never reaches the exit: the whole vector is gated
    "DRDRRRRDD": ((1, 0, 0, 1),) * 2,  # (1,0), a bump into the wall at (1,1), past the bonus
    "DDDDRRRRUUL": ((1, 0, 1, 1),) * 2,  # moves after the exit are ignored
    "RRRLDDRRDD": ((1, 1 / 3, 0, 0),  # one gold tile, back through the lava and the bonus
                   (1, 1.5 / 9, 0, 0)),
    "DDRRRRUDDD": ((1, 1 / 3, 0, 1),  # the bonus, then one gold tile
                   (1, 1.5 / 9, 0, 1)),
    "DDDURRRRDD": ((1, 0, 1 / 3, 1),  # one diamond, then the bonus
                   (1, 0, 1.5 / 9, 1)),
    "RRRRDDLLDDRR": ((0, 0, 0, 0),) * 2,  # all gold and the bonus, one move over the budget
}


def test_record_round_trip_and_arrays(task):
    assert maze.grid_to_record(GRID, np.int64(BUDGET)) == RECORD
    np.testing.assert_array_equal(maze.record_grid(RECORD), GRID)
    assert maze.record_grid(RECORD).dtype == np.int8
    records = task.make_problems(5, 4)
    assert records == task.make_problems(5, 4)  # deterministic in the seed
    assert json.loads(json.dumps(records)) == records
    for r in records:
        assert maze.grid_to_record(maze.record_grid(r), r["budget"]) == r
    arrays = task.arrays(records)
    assert arrays.grid.shape == (4, 5, 5) and arrays.grid.dtype == np.int8
    assert arrays.budget.shape == (4,) and arrays.budget.dtype == np.int32
    with pytest.raises(ValueError, match="cell chars"):
        maze.record_grid({"grid": ["S.", ".Q"], "budget": 3})


def test_same_mazes_as_the_generator(task):
    rng = np.random.default_rng(3)
    cfg = maze_world.MazeConfig()
    for record in task.make_problems(3, 3):
        grid, budget = maze_world.generate(rng, cfg)
        assert record == maze.grid_to_record(grid, budget)


def test_hand_written_routes():
    routes = list(HAND_ROUTES)
    moves, mask = _routes_to_arrays(routes, 16)
    got_KSR = np.asarray(simulate_both(GRID[None], np.int32([BUDGET]), moves[None], mask[None]))[0]
    for route, row_SR in zip(routes, got_KSR, strict=True):
        for scoring, row in zip(SCORINGS, row_SR, strict=True):
            want = HAND_ROUTES[route][scoring == "convex_bonus"]
            np.testing.assert_allclose(row, want, atol=1e-6, err_msg=route)
            host = maze_world.route_reward(GRID, BUDGET, list(route), scoring)
            np.testing.assert_array_equal(row, np.float32(host), err_msg=route)
            assert ref.reward(RECORD, list(route), scoring) == pytest.approx(want), route


def test_score_parses_answers_and_masks_duplicates_and_foreign_words(task):
    text = answers.format_answers(["R R R R D D D D", "R R R R  D D D D", "U X R"]) + "\n"
    slots = answers.parse_answers(text, 5)
    assert slots[3:] == [None, None]
    rewards, valid = task.score([RECORD], [slots])
    assert rewards.shape == (1, 5, 4) and rewards.dtype == np.float32
    np.testing.assert_array_equal(valid, [[True, False, False, False, False]])
    np.testing.assert_allclose(rewards[0], [[1, 1, 0, 1]] + [[0] * 4] * 4)
    np.testing.assert_array_equal(task.solved(rewards[0]), [True] + [False] * 4)
    assert bool(jax.jit(task.solved)(jnp.asarray(rewards[0, 0])))
    # solved: w*ᵀr >= 3/4, a lava-free full zone or as good (parts of both zones and the bonus)
    assert bool(task.solved(np.array([1, 1, 0, 1], np.float32)))
    assert bool(task.solved(np.array([1, 1.5 * 4 / 9, 1.5 * 4 / 9, 1], np.float32)))
    assert bool(task.solved(jnp.array([1, 0.5, 0.5, 1])))
    assert not bool(task.solved(jnp.array([1, 1 / 3, 0, 1])))
    assert not bool(task.solved(np.array([1.0, 1, 0, 0])))  # full zone but through lava
    assert not bool(task.solved(np.array([1.0, 0.5, 0.5, 0.99])))


@pytest.mark.parametrize("answer", ["", "   ", "U D x", "U <answer 2> D", "move U",
                                    " ".join("U" * 17), "u d", None])
def test_malformed_answers_are_invalid(task, answer):
    rewards, valid = task.score([RECORD], [["D D D D R R R R", answer]])
    np.testing.assert_array_equal(valid, [[True, False]])
    assert not rewards[0, 1].any()


def _random_routes(grid, A, rng, num):
    """`num` routes of 1..A moves, most of which reach E: random shortest legs (through lava
    too) via 0..3 random tiles with random moves spliced in; a quarter are uniform moves."""
    start, exit_ = maze_world.endpoints(grid)
    tiles = [tuple(t) for t in np.argwhere((grid != WALL) & (grid != EXIT)).tolist()]
    inverse = {d: m for m, d in maze_world.MOVES.items()}
    routes = []
    while len(routes) < num:
        if len(routes) % 4 == 3:
            routes.append(list(rng.choice(maze.MOVES, size=rng.integers(1, A + 1))))
            continue
        stops = [tiles[i] for i in rng.choice(len(tiles), rng.integers(0, 4))] + [exit_]
        moves, cur = [], start
        try:
            for stop in stops:
                for nxt in maze_world._random_path(grid, cur, stop, rng, avoid_lava=False):
                    moves.append(inverse[(nxt[0] - cur[0], nxt[1] - cur[1])])
                    cur = nxt
        except ValueError:  # a stop that only a walk through E reaches
            continue
        for _ in range(rng.integers(0, 3)):
            moves.insert(rng.integers(len(moves) + 1), str(rng.choice(maze.MOVES)))
        routes.append(moves[:A] or ["U"])
    return routes


@pytest.mark.parametrize("paper", [False, True], ids=["maze5", "maze9"])
def test_in_graph_reward_equals_host_score_and_the_authors_rules(paper):
    tasks = [(maze.make_paper_maze_task if paper else maze.make_maze_task)(scoring=s)
             for s in SCORINGS]
    task = tasks[0]
    records = task.make_problems(11, 8)
    assert tasks[1].make_problems(11, 8) == records  # the scoring leaves the mazes alone
    arrays = task.arrays(records)
    rng = np.random.default_rng(0)
    A = task.answer_len
    routes_NK = []
    for r in records:
        routes = [" ".join(m) for m in _random_routes(maze.record_grid(r), A, rng, 48)]
        routes += task.demonstrations(r, rng, 3)
        routes_NK.append(list(dict.fromkeys(routes)))
    K = max(map(len, routes_NK))
    moves_NKA = np.zeros((len(records), K, A), np.int32)
    mask_NKA = np.zeros((len(records), K, A), bool)
    for n, routes in enumerate(routes_NK):
        moves, mask = _routes_to_arrays([r.split() for r in routes], A)
        moves_NKA[n, :len(routes)], mask_NKA[n, :len(routes)] = moves, mask
    got_NKSR = np.asarray(simulate_both(arrays.grid, arrays.budget, moves_NKA, mask_NKA))
    assert got_NKSR.dtype == np.float32
    for s, (scoring, scored) in enumerate(zip(SCORINGS, tasks, strict=True)):
        want, valid = scored.score(records, routes_NK)
        for n, routes in enumerate(routes_NK):
            assert valid[n, :len(routes)].all()
            np.testing.assert_array_equal(got_NKSR[n, :len(routes), s], want[n, :len(routes)])
            for k, route in enumerate(routes):
                np.testing.assert_allclose(want[n, k],
                                           ref.reward(records[n], route.split(), scoring),
                                           atol=1e-6, err_msg=route)
    reached, bonus = 0, 0
    for n, routes in enumerate(routes_NK):
        sims = [ref.simulate(records[n]["grid"], r.split(), records[n]["budget"]) for r in routes]
        reached += sum(s["reached_end"] for s in sims)
        bonus += sum(s["reached_end"] and s[ref.BONUS] > 0 for s in sims)
    total = sum(map(len, routes_NK))
    assert reached > total / 3 and bonus > total / 10  # the routes exercise the scorer


@pytest.mark.parametrize("config", [dict(size=5), dict(size=7), maze.PAPER_CONFIG],
                         ids=["5x5", "7x7", "paper"])
def test_generator_follows_the_authors_rules(config):
    cfg = maze_world.MazeConfig(**config)
    n, rng = cfg.size, np.random.default_rng(cfg.size)
    layouts = set()
    for _ in range(24 if n < 9 else 16):
        grid, budget = maze_world.generate(rng, cfg)
        record = maze.grid_to_record(grid, budget)
        rows = record["grid"]
        f = ref.facts(record, cfg.zone_radius)
        s, e = f["start"], f["exit"]
        assert s[0] == 0 and e == (n - 1, n - 1 - s[1])  # S on the top row, E opposite
        assert f["gold"] is not None and f["diamond"] is not None  # items in Manhattan zones
        layouts.add((s, f["gold"]))
        if not cfg.random_corners:
            assert (s, e, f["gold"], f["diamond"]) == ((0, 0), (n - 1, n - 1), (0, n - 1),
                                                       (n - 1, 0))
        assert ref.find(rows, ref.BONUS) == [f["centre"]]
        for ch in (ref.GOLD, ref.DIAMOND):
            assert cfg.items[0] <= len(ref.find(rows, ch)) <= cfg.items[1]
        lava = ref.find(rows, ref.LAVA)
        inner = range(cfg.zone_radius, n - cfg.zone_radius)
        assert all(r in inner and c in inner for r, c in lava)
        assert len(lava) <= cfg.lava[1]
        assert len(lava) >= cfg.lava[0] or not any(rows[r][c] == "." for r in inner for c in inner)
        # budget and conflict from routes to the corner cells; reachable centre; safe exit
        assert budget == max(f["via_gold"], f["via_diam"]) + cfg.slack <= cfg.answer_len
        assert f["via_gold_then_diam"] > budget and f["via_center"] < float("inf")
        assert f["d_safe"] <= budget
        # this project's addition: a lava-free whole-zone route fits (`maze.solved` reachable)
        assert min(ref.full_zone_steps(record, ch) for ch in (ref.GOLD, ref.DIAMOND)) <= budget
    assert len(layouts) == (4 if cfg.random_corners else 1)


def test_best_tour_on_the_hand_maze():
    gold = maze_world.zone_items(GRID, GOLD)
    assert maze_world.best_tour(GRID, gold, avoid_lava=True)[0] == 8
    assert maze_world.best_tour(GRID, [], avoid_lava=True)[0] == 8
    both = gold + maze_world.zone_items(GRID, DIAMOND)
    assert maze_world.best_tour(GRID, both, avoid_lava=False)[0] > BUDGET


def test_statement_renders_grid_and_budget(task):
    text = task.statement(RECORD)
    assert text == text.strip()
    lines = text.split("\n")
    assert lines[0] == ("Maze (S start, E exit, # wall, . floor, g gold, d diamond, x lava, "
                        "b bonus):")
    assert lines[1:6] == ["S . . g g", ". # x # g", ". . b . .", "d # . # .", "d d . . E"]
    assert lines[6] == ("Go from S to E in at most 11 moves; collect gold and diamonds; avoid "
                        "lava; scores are squared fractions, x1.5 after b.")
    linear = maze.make_maze_task(scoring="linear")
    assert linear.statement(RECORD).split("\n")[6] == (
        "Go from S to E in at most 11 moves; collect all gold or all diamonds; avoid lava.")
    assert set(linear.statement(RECORD).split()) <= set(linear.words)
    for r in task.make_problems(1, 6) + [RECORD]:
        text = task.statement(r)
        rows = text.split("\n")[1:-1]
        assert len(rows) == 5 and all(len(row.split()) == 5 for row in rows)
        assert f" {r['budget']} moves" in text
        assert set(text.split()) <= set(task.words)
    assert set(maze.CELL_CHARS) | set(task.symbols) <= set(task.words)
    assert {str(i) for i in range(task.answer_len + 1)} <= set(task.words)
    assert task.answer_hint == maze.ANSWER_HINT and task.symbols == ("U", "D", "L", "R")


def test_demonstrations_are_distinct_valid_and_scoring(task):
    rng = np.random.default_rng(0)
    boosted = 0
    for record in task.make_problems(2, 8):
        demos = task.demonstrations(record, rng, 3)
        assert len(demos) == 3 and len(set(demos)) == 3
        rewards, valid = task.score([record], [demos])
        assert valid.all() and (rewards[0, :, 0] == 1).all() and (rewards[0, :, 3] == 1).all()
        assert all(len(d.split()) <= record["budget"] for d in demos)
        sims = [ref.simulate(record["grid"], d.split(), record["budget"]) for d in demos]
        boosted += sum(s[ref.BONUS] > 0 and s[ref.GOLD] + s[ref.DIAMOND] > 0 for s in sims)
    assert boosted >= 4  # the via-bonus slot shows items collected with the multiplier


def test_demonstrations_on_a_maze_with_two_simple_routes(task):
    # Only R R R R D D D D and D D D D R R R R are loop-free and lava-free: later slots detour.
    record = {"grid": ["S...g", ".#x#g", ".#.#.", "d#x#.", "dd..E"], "budget": 11}
    for seed in range(5):
        demos = task.demonstrations(record, np.random.default_rng(seed), 8)
        assert len(set(demos)) == 8
        rewards, valid = task.score([record], [demos])
        assert valid.all() and (rewards[0, :, 0] == 1).all() and (rewards[0, :, 3] == 1).all()


def test_partial_demonstrations_reach_the_exit_without_solving():
    """demos="partial": distinct lava-free routes to E within budget, none solved where the grid
    has an unsolved route (plain and mutation rows alike); on a grid whose every loop-free
    route sweeps a whole zone the slots are still distinct."""
    task = maze.make_maze_task(7, demos="partial")
    rng = np.random.default_rng(0)
    for record in task.make_problems(2, 8):
        demos = task.demonstrations(record, rng, 3)
        assert len(demos) == 3 and len(set(demos)) == 3
        rewards, valid = task.score([record], [demos])
        assert valid.all() and (rewards[0, :, 0] == 1).all() and (rewards[0, :, 3] == 1).all()
        assert not np.asarray(task.solved(rewards[0])).any()
        parents, children = task.mutation_demonstrations(record, rng, 3, 3)
        rp, _ = task.score([record], [parents])
        rc, _ = task.score([record], [children])
        assert not np.asarray(task.solved(rc[0])).any()
        w_R = task.eval_weights_R
        assert (rc[0] @ w_R).min() > (rp[0] @ w_R).max()
    record = {"grid": ["S...g", ".#x#g", ".#.#.", "d#x#.", "dd..E"], "budget": 11}
    demos = maze.make_maze_task(demos="partial").demonstrations(record, rng, 4)
    assert len(set(demos)) == 4
    with pytest.raises(ValueError, match="demos"):
        maze.make_maze_task(demos="some")


@pytest.mark.parametrize("scoring", SCORINGS)
def test_mutation_children_beat_every_parent(scoring):
    task = maze.make_maze_task(scoring=scoring)
    rng = np.random.default_rng(1)
    w_R = task.eval_weights_R
    for record in task.make_problems(4, 8):
        parents, children = task.mutation_demonstrations(record, rng, 3, 3)
        assert 1 <= len(parents) <= 3 and len(children) == 3 and len(set(children)) == 3
        assert not set(parents) & set(children)
        rp, vp = task.score([record], [parents])
        rc, vc = task.score([record], [children])
        assert vp.all() and vc.all()
        assert (rc[0] @ w_R).min() > (rp[0] @ w_R).max()
        assert bool(task.solved(rc[0, 0]))


def test_paper_preset_builds_a_9x9_instance():
    task = maze.make_paper_maze_task()
    (record,) = task.make_problems(0, 1)
    assert len(record["grid"]) == 9 and all(len(row) == 9 for row in record["grid"])
    assert task.name == "maze9" and task.answer_len == 40
    demos = task.demonstrations(record, np.random.default_rng(0), 3)
    _, valid = task.score([record], [demos])
    assert len(demos) == 3 and valid.all()
    assert set(task.statement(record).split()) <= set(task.words)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="odd"):
        maze.make_maze_task(6)
    with pytest.raises(ValueError, match="open_frac"):
        maze.make_maze_task(open_frac=2.0)
    with pytest.raises(ValueError, match="scoring"):
        maze.make_maze_task(scoring="squared")


def test_task_contract(task):
    assert isinstance(task, base.Task) and not task.is_host
    assert task.name == "maze5" and task.reward_names == maze_world.REWARD_NAMES
    np.testing.assert_allclose(task.eval_weights_R, 0.25)
    assert task.max_answers == 8 and maze.make_maze_task(max_answers=3).max_answers == 3
