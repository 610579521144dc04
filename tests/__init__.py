"""The tests, in folders mirroring the package (`tests/rl` tests `vpo.rl`, ...);
`tests/project` holds the checks of the repository as a whole (layers, docs, packaging,
committed reports), `tests/experiments` those of the scripts in experiments/."""
