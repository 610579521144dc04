"""PNG plots of evaluation results: metric-vs-k curves per arm, metrics over training steps.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas directly: no pyplot, no global
figure state, no backend switch, safe in threads and headless machines. Each function writes one
PNG and returns its path.

Series are `{arm or run name: (xs, ys)}` mappings, e.g. `{"grpo": ([1, 3, 10], [.4, .5, .55]),
"vpo": (...)}`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def _save(fig: Figure, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # matplotlib's tab10
_LINESTYLES = ("-", ":", "-.")


def series_style(i: int) -> dict[str, str]:
    """Colour and line style of the i-th series of a plot: the ten colours, then again dotted,
    then dash-dotted, so up to 30 series stay distinguishable (a comparison has 13)."""
    return {"color": _COLORS[i % len(_COLORS)],
            "linestyle": _LINESTYLES[(i // len(_COLORS)) % len(_LINESTYLES)]}


def _draw(ax, series: Series, *, marker: str | None, dashed: Collection[str] = ()) -> None:
    """One line per series (`series_style`); a series named in `dashed` is dashed in the colour
    of the series drawn just before it (e.g. a fit after its data)."""
    color, i = None, 0
    for name, (xs, ys) in series.items():
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        if xs.shape != ys.shape:
            raise ValueError(f"series {name!r}: {xs.shape[0]} x values but {ys.shape[0]} y values")
        if name in dashed:
            ax.plot(xs, ys, linestyle="--", color=color, label=name)
        else:
            style = series_style(i)
            ax.plot(xs, ys, marker=marker, label=name, **style)
            color, i = style["color"], i + 1
    if len(series) > 1:
        ax.legend()
    ax.grid(alpha=0.3)


def plot_metric_vs_k(path: str, curves: Series, *, metric: str = "best@k",
                     title: str | None = None, log_x: bool = True,
                     xlabel: str = "k (candidate solutions)") -> str:
    """One line per arm of `metric` (best@k, pass@k, ...) against the candidate budget k."""
    fig = Figure(figsize=(5.0, 3.6))
    ax = fig.add_subplot()
    _draw(ax, curves, marker="o")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} vs k")
    return _save(fig, path)


def plot_metrics_over_steps(path: str, panels: Mapping[str, Series], *,
                            title: str | None = None, dashed: Collection[str] = ()) -> str:
    """One panel per metric (e.g. "entropy", "diversity"), one line per run, against the step;
    series named in `dashed` are dashed in the colour of the series before them."""
    if not panels:
        raise ValueError("panels is empty: give at least one {metric: {run: (steps, values)}}")
    fig = Figure(figsize=(4.2 * len(panels), 3.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (metric, series) in zip(axes, panels.items(), strict=True):
        _draw(ax, series, marker=None, dashed=dashed)
        ax.set_xlabel("training step")
        ax.set_ylabel(metric)
        ax.set_title(metric)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def combine_pngs(path: str, rows: Sequence[Sequence[str]], *, title: str | None = None) -> str:
    """PNG files tiled into one figure, one figure row per entry of `rows` (each row split
    evenly between its images, so a wide plot can have a row to itself), axes hidden."""
    from matplotlib.image import imread

    rows = [list(r) for r in rows if len(r)]
    if not rows:
        raise ValueError("rows is empty: give at least one row with one PNG path")
    images = [[imread(p) for p in r] for r in rows]
    heights = [max(im.shape[0] / im.shape[1] * (1.0 / len(r)) for im in r) for r in images]
    width = 12.0
    fig = Figure(figsize=(width, width * sum(heights) + (0.4 if title else 0.0)))
    grid = fig.add_gridspec(len(rows), 1, height_ratios=heights)
    for i, row in enumerate(images):
        axes = grid[i].subgridspec(1, len(row)).subplots(squeeze=False)[0]
        for ax, im in zip(axes, row, strict=True):
            ax.imshow(im)
            ax.axis("off")
    if title:
        fig.suptitle(title)
    return _save(fig, path)
