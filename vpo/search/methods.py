"""Every search method on any task: in one jit per method for in-graph tasks
(`vpo.search.ingraph.run_method`), on the host between generations for host-scored tasks
(`vpo.search.host.run_host_method`); both return a `SearchResult`."""

from __future__ import annotations

from collections.abc import Sequence

from vpo.search.host import run_host_method
from vpo.search.ingraph import METHODS, SearchConfig, SearchResult, run_method, search_problems
from vpo.tasks.base import Record
from vpo.tasks.bound import BoundTask, GraphTask, HostTask, for_kind


def run_all_methods(key, model, task: BoundTask, records: Sequence[Record], cfg: SearchConfig,
                    *, mesh=None, max_new_tokens: int | None = None, progress: bool = False,
                    methods: Sequence[str] = METHODS) -> dict[str, SearchResult]:
    """Search, best-of-N and revision (or `methods`) at the same budget on every record →
    {method: result} (islands sharded over `mesh` when they divide evenly over its data
    devices). `progress`: bars on stderr, per generation for host-scored tasks, per method for
    in-graph ones (each method is one jit)."""
    return for_kind(RUNNERS, task)(key, model, task, records, cfg, mesh=mesh,
                                   max_new_tokens=max_new_tokens, progress=progress,
                                   methods=methods)


def _host_methods(key, model, task, records, cfg, *, mesh, max_new_tokens, progress, methods):
    """Each method on the host, the task's scorer (or the environment) between generations."""
    del mesh
    return {method: run_host_method(key, method, model, task, records, cfg,
                                    max_new_tokens=max_new_tokens, progress=progress)
            for method in methods}


def _in_graph_methods(key, model, task, records, cfg, *, mesh, max_new_tokens, progress,
                      methods):
    """Each method in one jit (the island search sharded over `mesh`'s data devices)."""
    import tqdm

    del max_new_tokens  # the task's own answer budget
    problems = search_problems(task, list(records), cfg.num_answers)
    out = {}
    bar = tqdm.tqdm(methods, desc="search methods", unit="method", disable=not progress)
    for method in bar:
        bar.set_postfix_str(method)
        m = mesh if method == "search" else None
        if m is not None and cfg.islands % m.shape["data"]:
            m = None  # islands must split evenly over the data devices; else one device
        out[method] = run_method(key, method, model, task, problems, cfg, mesh=m)
    return out


# how each task kind runs the methods
RUNNERS = {GraphTask: _in_graph_methods, HostTask: _host_methods}
