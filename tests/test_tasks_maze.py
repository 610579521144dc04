"""Maze: generator invariants, hand-written routes, in-graph reward == plain-Python reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import base, maze, maze_world
from vpo.tasks.maze_world import DIAMOND, EMPTY, EXIT, GOLD, LAVA, START, WALL

# A hand-made 5x5 maze (budget 11):      S . . g g
#                                         . # ~ # g
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


def test_hand_written_routes(simulate):
    routes = list(HAND_ROUTES)
    moves, mask = _routes_to_arrays(routes, 16)
    got = np.asarray(simulate(jnp.asarray(GRID), jnp.int32(BUDGET), moves, mask))
    for route, row in zip(routes, got, strict=True):
        np.testing.assert_allclose(row, HAND_ROUTES[route], atol=1e-6, err_msg=route)
        assert maze_world.route_reward(GRID, BUDGET, list(route)) == pytest.approx(
            HAND_ROUTES[route]), route


def test_reward_parses_answers_and_masks_duplicates_and_foreign_tokens(task):
    problem = maze.MazeProblems(GRID, np.int32(BUDGET))
    text = "R R R R D D D D <sep> R R R R D D D D <sep> D D budget D D R R R R <eos>"
    tokens, mask = base.encode_completion(task.vocab, text, task.completion_len(3))
    rewards, valid = jax.jit(task.reward, static_argnums=3)(problem, tokens, mask, 3)
    np.testing.assert_array_equal(valid, [True, False, False])
    np.testing.assert_allclose(rewards, [[1, 1, 0, 1], [0] * 4, [0] * 4])
    assert bool(task.solved(rewards[0]))
    assert not bool(task.solved(jnp.array([1.0, 1 / 3, 0, 1])))
    assert not bool(task.solved(jnp.array([1.0, 1, 0, 0])))  # full zone but through lava


def test_in_graph_reward_equals_reference_on_random_routes(task, simulate):
    problems = task.make_problems(11, 6)
    rng = np.random.default_rng(0)
    A = task.answer_len
    for i in range(len(problems.budget)):
        grid, budget = problems.grid[i], int(problems.budget[i])
        routes = [list(rng.choice(list("UDLR"), size=rng.integers(1, A + 1))) for _ in range(40)]
        routes += maze.demo_routes(grid, budget, rng, 3)  # routes that do reach the exit
        moves, mask = _routes_to_arrays(routes, A)
        got = np.asarray(simulate(jnp.asarray(grid), jnp.int32(budget), moves, mask))
        want = np.array([maze_world.route_reward(grid, budget, r) for r in routes])
        np.testing.assert_allclose(got, want, atol=1e-6)


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


def test_prompt_renders_grid_budget_and_answer_count(task):
    prompt = task.prompt_tokens(maze.MazeProblems(GRID, np.int32(BUDGET)), 3)
    text = task.vocab.decode(np.asarray(prompt))
    assert text.startswith("<bos> start . . gold gold / . # lava # gold /")
    assert text.endswith("diamond diamond . . exit / budget 11 m3")


def test_paper_preset_builds_a_9x9_instance():
    task = maze.make_paper_maze_task()
    problems = task.make_problems(0, 1)
    assert problems.grid.shape == (1, 9, 9) and task.prompt_len == 94
    demo = task.demonstrations(base.index_problem(problems, 0), np.random.default_rng(0), 3)
    assert demo.count(task.vocab.sep_id) == 2


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="odd"):
        maze.make_maze_task(6)
    with pytest.raises(ValueError, match="open_frac"):
        maze.make_maze_task(open_frac=2.0)
