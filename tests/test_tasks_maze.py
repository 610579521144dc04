"""Maze: generator invariants, records and text, hand-written routes, in-graph reward == host."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import answers, base, maze, maze_world
from vpo.tasks.maze_world import DIAMOND, EMPTY, EXIT, GOLD, LAVA, START, WALL

# A hand-made 5x5 maze (budget 11):      S . . g g
#                                         . # x # g
#                                         . . . . .
#                                         d # . # .
#                                         d d . . E
_ = EMPTY
GRID = np.array([[START, _, _, GOLD, GOLD],
                 [_, WALL, LAVA, WALL, GOLD],
                 [_, _, _, _, _],
                 [DIAMOND, WALL, _, WALL, _],
                 [DIAMOND, DIAMOND, _, _, EXIT]], np.int8)
BUDGET = 11
RECORD = {"grid": ["S..gg", ".#x#g", ".....", "d#.#.", "dd..E"], "budget": BUDGET}


@pytest.fixture(scope="module")
def task():
    return maze.make_maze_task()


@pytest.fixture(scope="module")
def simulate():
    return jax.jit(jax.vmap(maze.simulate_route, in_axes=(None, None, 0, 0)))


def _routes_to_arrays(routes, A):
    moves = np.zeros((len(routes), A), np.int32)
    mask = np.zeros((len(routes), A), bool)
    for i, r in enumerate(routes):
        moves[i, :len(r)] = ["UDLR".index(m) for m in r]
        mask[i, :len(r)] = True
    return moves, mask


HAND_ROUTES = {  # route -> (completion, gold, diamond, avoid_lava)
    "RRRRDDDD": (1, 1, 0, 1),  # along the gold zone
    "DDDDRRRR": (1, 0, 1, 1),  # along the diamond zone
    "RRDDRRDD": (1, 0, 0, 0),  # straight through the single lava tile
    "UUURRRRDDDD": (1, 1, 0, 1),  # 3 bumps into the border: arrives exactly at the budget
    "UUUURRRRDDDD": (0, 0, 0, 0),  # one bump more: arrives after the budget
    "RRR": (0, 0, 0, 0),  # never reaches the exit: the whole vector is gated
    "DRDRRRRDD": (1, 0, 0, 1),  # (1,0), a bump into the wall at (1,1), then round the lava
    "DDDDRRRRUUL": (1, 0, 1, 1),  # moves after the exit are ignored
    "RRRLDDRRDD": (1, 1 / 3, 0, 0),  # one gold tile, then back and through the lava
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


def test_hand_written_routes(simulate):
    routes = list(HAND_ROUTES)
    moves, mask = _routes_to_arrays(routes, 16)
    got = np.asarray(simulate(jnp.asarray(GRID), jnp.int32(BUDGET), moves, mask))
    for route, row in zip(routes, got, strict=True):
        np.testing.assert_allclose(row, HAND_ROUTES[route], atol=1e-6, err_msg=route)
        assert maze_world.route_reward(GRID, BUDGET, list(route)) == pytest.approx(
            HAND_ROUTES[route]), route


def test_score_parses_answers_and_masks_duplicates_and_foreign_words(task):
    text = answers.format_answers(["R R R R D D D D", "R R R R  D D D D", "U X R"]) + "\n"
    slots = answers.parse_answers(text, 5)
    assert slots[3:] == [None, None]
    rewards, valid = task.score([RECORD], [slots])
    assert rewards.shape == (1, 5, 4) and rewards.dtype == np.float32
    np.testing.assert_array_equal(valid, [[True, False, False, False, False]])
    np.testing.assert_allclose(rewards[0], [[1, 1, 0, 1]] + [[0] * 4] * 4)
    assert bool(task.solved(rewards[0, 0]))
    assert float(task.eval_weights_R @ rewards[0, 0]) >= 0.75
    assert not bool(task.solved(jnp.array([1.0, 1 / 3, 0, 1])))
    assert not bool(task.solved(np.array([1.0, 1, 0, 0])))  # full zone but through lava
    np.testing.assert_array_equal(task.solved(rewards[0]), [True] + [False] * 4)
    assert bool(jax.jit(task.solved)(jnp.asarray(rewards[0, 0])))


@pytest.mark.parametrize("answer", ["", "   ", "U D x", "U <answer 2> D", "move U",
                                    " ".join("U" * 17), "u d", None])
def test_malformed_answers_are_invalid(task, answer):
    rewards, valid = task.score([RECORD], [["D D D D R R R R", answer]])
    np.testing.assert_array_equal(valid, [[True, False]])
    assert not rewards[0, 1].any()


def test_in_graph_reward_equals_host_score(task):
    records = task.make_problems(11, 8)
    arrays = task.arrays(records)
    rng = np.random.default_rng(0)
    A, S = task.answer_len, len(task.symbols)
    routes_NK = []
    for r in records:
        routes = [" ".join(rng.choice(task.symbols, size=rng.integers(1, A + 1)))
                  for _ in range(40)]
        routes += task.demonstrations(r, rng, 3)  # routes that do reach the exit
        routes_NK.append(list(dict.fromkeys(routes)))
    K = max(map(len, routes_NK))
    moves_NKA = np.zeros((len(records), K, A), np.int32)
    mask_NKA = np.zeros((len(records), K, A), bool)
    for n, routes in enumerate(routes_NK):
        moves, mask = _routes_to_arrays([r.split() for r in routes], A)
        moves_NKA[n, :len(routes)], mask_NKA[n, :len(routes)] = moves, mask
    reward = jax.jit(jax.vmap(jax.vmap(task.symbol_reward, in_axes=(None, 0, 0))))
    got = np.asarray(reward(arrays, moves_NKA, mask_NKA))
    assert got.dtype == np.float32 and S == 4
    want, valid = task.score(records, routes_NK)
    for n, routes in enumerate(routes_NK):
        assert valid[n, :len(routes)].all()
        np.testing.assert_allclose(got[n, :len(routes)], want[n, :len(routes)], atol=1e-6)
        for k, route in enumerate(routes):
            grid = maze.record_grid(records[n])
            np.testing.assert_allclose(
                want[n, k], maze_world.route_reward(grid, records[n]["budget"], route.split()))


@pytest.mark.parametrize("size", [5, 7])
def test_generator_invariants(size):
    cfg = maze_world.MazeConfig(size=size)
    rng = np.random.default_rng(size)
    for _ in range(12):
        grid, budget = maze_world.generate(rng, cfg)
        n = cfg.size
        assert grid[0, 0] == START and grid[n - 1, n - 1] == EXIT
        gold, diamond = maze_world.zone_items(grid, GOLD), maze_world.zone_items(grid, DIAMOND)
        assert cfg.items[0] <= len(gold) <= cfg.items[1] and len(diamond) >= cfg.items[0]
        assert all(max(r, n - 1 - c) <= cfg.zone_radius for r, c in gold)
        assert all(max(n - 1 - r, c) <= cfg.zone_radius for r, c in diamond)
        assert cfg.lava[0] <= np.sum(grid == LAVA) <= cfg.lava[1]
        via_gold, _ = maze_world.best_tour(grid, gold, avoid_lava=True)
        via_diamond, _ = maze_world.best_tour(grid, diamond, avoid_lava=True)
        both, _ = maze_world.best_tour(grid, gold + diamond, avoid_lava=False)
        direct, _ = maze_world.best_tour(grid, [], avoid_lava=False)
        assert direct <= max(via_gold, via_diamond) <= budget - cfg.slack  # exit reachable
        assert budget == max(via_gold, via_diamond) + cfg.slack <= cfg.answer_len
        assert both > budget  # the designed conflict: both zones never fit


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
    assert lines[0] == "Maze (S start, E exit, # wall, . floor, g gold, d diamond, x lava):"
    assert lines[1:6] == ["S . . g g", ". # x # g", ". . . . .", "d # . # .", "d d . . E"]
    assert lines[6] == ("Go from S to E in at most 11 moves; collect all gold or all diamonds; "
                        "avoid lava.")
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
    for record in task.make_problems(2, 8):
        demos = task.demonstrations(record, rng, 3)
        assert len(demos) == 3 and len(set(demos)) == 3
        rewards, valid = task.score([record], [demos])
        assert valid.all() and (rewards[0, :, 0] == 1).all() and (rewards[0, :, 3] == 1).all()
        assert all(len(d.split()) <= record["budget"] for d in demos)


def test_demonstrations_on_a_maze_with_two_simple_routes(task):
    # Only R R R R D D D D and D D D D R R R R are loop-free and lava-free: later slots detour.
    record = {"grid": ["S...g", ".#x#g", ".#.#.", "d#x#.", "dd..E"], "budget": 11}
    for seed in range(5):
        demos = task.demonstrations(record, np.random.default_rng(seed), 8)
        assert len(set(demos)) == 8
        rewards, valid = task.score([record], [demos])
        assert valid.all() and (rewards[0, :, 0] == 1).all() and (rewards[0, :, 3] == 1).all()


def test_mutation_children_beat_every_parent(task):
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


def test_task_contract(task):
    assert isinstance(task, base.Task) and not task.is_host
    assert task.name == "maze5" and task.reward_names == maze_world.REWARD_NAMES
    np.testing.assert_allclose(task.eval_weights_R, 0.25)
    assert task.max_answers == 8 and maze.make_maze_task(max_answers=3).max_answers == 3
