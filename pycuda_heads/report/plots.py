"""The report's PNG plots, drawn with matplotlib's Agg canvas (no display, no pyplot state)."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any, Callable, Sequence

from .data import (
    FLOOR_GOAL,
    LABELS,
    PROVIDERS,
    BenchResult,
    pass_order,
    shape_size,
    shape_text,
)

# Markers only: the shapes along x are categories, and a line between two of them would say
# something about the shapes between, which were not measured.
STYLE = {"tuned": ("C0", "o"), "default": ("C1", "s"), "torch_eager": ("C2", "^"),
         "torch_compile": ("C3", "v"), "floor": ("k", "_")}
# Tuned and default often coincide: default is drawn wide and hollow underneath, tuned on top.
UNDER = {"default": {"markersize": 10, "markerfacecolor": "none", "alpha": 0.6, "zorder": 2},
         "floor": {"markersize": 14, "markeredgewidth": 2, "zorder": 3}}


def available() -> bool:
    """Whether plots can be drawn: matplotlib comes with the ``report`` extra."""
    return importlib.util.find_spec("matplotlib") is not None


def _drawn(draw: Callable[..., bool]) -> Callable[..., bool]:
    """``draw`` returns whether it wrote its file; without matplotlib it writes none."""
    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> bool:
        return available() and draw(*args, **kwargs)
    return wrapper


def _plot(ax: Any, provider: str, points: Sequence[tuple[float, float]]) -> None:
    color, marker = STYLE[provider]
    ax.plot(*zip(*points), color=color, marker=marker, linestyle="", label=LABELS[provider],
            **UNDER.get(provider, {"zorder": 3}))


def _legend_below(fig: Any, axes: Sequence[Any]) -> None:
    """One legend for all panels, under them, where it covers no data."""
    handles, labels = {}, {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    labels = list(handles)
    fig.legend([handles[k] for k in labels], labels, loc="outside lower center",
               ncols=min(len(labels), 6), fontsize=8)


def _figure(n_panels: int, width: float = 4.6, height: float = 3.6) -> Any:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width * n_panels, height), layout="constrained")
    return fig, fig.subplots(1, n_panels, squeeze=False)[0]


def _panels(op_cases: Sequence[BenchResult]) -> list[tuple[str, list[BenchResult]]]:
    by_pass: dict[str, list[BenchResult]] = {}
    for c in op_cases:
        by_pass.setdefault(c.pass_, []).append(c)
    return [(p, sorted(by_pass[p], key=lambda c: shape_size(c.shape)))
            for p in sorted(by_pass, key=pass_order)]


@_drawn
def op_times(op: str, gpu: str, op_cases: Sequence[BenchResult], empty_us: float | None,
             path: Path) -> bool:
    """Median GPU time by shape of every provider (log scale), one panel per pass. The axis
    spans the measured times: a floor far below them is cut off, not allowed to squash them.
    False (and no file) when nothing was measured."""
    panels = _panels(op_cases)
    if not any(c.time(p) for _, cs in panels for c in cs for p in PROVIDERS):
        return False
    fig, axes = _figure(len(panels))
    for ax, (pass_, cs) in zip(axes, panels):
        x = range(len(cs))
        measured = []
        for provider in PROVIDERS:
            points = [(i, c.time(provider)) for i, c in zip(x, cs) if c.time(provider)]
            if points:
                _plot(ax, provider, points)
                measured += [t for _, t in points]
        floor = [(i, c.time("floor")) for i, c in zip(x, cs) if c.time("floor")]
        if measured:
            low, high = min(measured) / 2, max(measured) * 2
            if floor:
                _plot(ax, "floor", floor)
                if any(t < low for _, t in floor):
                    ax.text(0.02, 0.02, "floor: below the axis where not drawn",
                            transform=ax.transAxes, fontsize=7, color="k")
            ax.set_ylim(low, high)
        if empty_us:
            ax.axhline(empty_us, color="grey", linestyle=":", label="empty kernel")
        ax.set_yscale("log")
        ax.set_xticks(list(x), [c.shape for c in cs], rotation=30, ha="right", fontsize=8)
        ax.set_title(pass_)
        ax.set_ylabel("GPU time per call (us)")
        ax.grid(True, which="both", alpha=0.3)
    _legend_below(fig, axes)
    fig.suptitle(f"{op}: GPU time per call on {gpu}")
    fig.savefig(path, dpi=100)
    return True


@_drawn
def op_floor(op: str, gpu: str, op_cases: Sequence[BenchResult], path: Path) -> bool:
    """Fraction of the copy-bandwidth floor each provider reaches, one panel per pass, at the
    shapes whose data does not sit in L2. False (and no file) when no pass has both a floor and
    a time."""
    panels = [(pass_, [c for c in cs if not c.l2_resident]) for pass_, cs in _panels(op_cases)]
    panels = [(pass_, cs) for pass_, cs in panels if cs]
    if not any(c.time("floor") and c.time(p) for _, cs in panels for c in cs for p in PROVIDERS):
        return False
    fig, axes = _figure(len(panels))
    for ax, (pass_, cs) in zip(axes, panels):
        x = range(len(cs))
        top = 1.05
        for provider in PROVIDERS:
            points = [(i, c.time("floor") / c.time(provider)) for i, c in zip(x, cs)
                      if c.time("floor") and c.time(provider)]
            if points:
                _plot(ax, provider, points)
                top = max(top, 1.05 * max(f for _, f in points))
        ax.axhline(FLOOR_GOAL, color="k", linestyle="--", label=f"goal {FLOOR_GOAL:.0%}")
        ax.set_ylim(0, top)
        ax.set_xticks(list(x), [c.shape for c in cs], rotation=30, ha="right", fontsize=8)
        ax.set_title(pass_)
        ax.set_ylabel("floor time / time")
        ax.grid(True, alpha=0.3)
    _legend_below(fig, axes)
    fig.suptitle(f"{op}: fraction of the copy-bandwidth floor on {gpu}")
    fig.savefig(path, dpi=100)
    return True


@_drawn
def tuning(cache: dict[str, Any], gpu: str, exhaustive_us: float | None, path: Path) -> bool:
    """Best-so-far time against trial for every study of one cache, and the knobs' importance.
    False (and no file) when the cache holds neither."""
    from matplotlib.ticker import MaxNLocator
    studies: dict[str, list[tuple[float, float]]] = {}
    for h in cache.get("history") or ():
        if h.get("best_so_far_us") is not None and h.get("trial") is not None:
            label = f"{h.get('mode', h.get('study', '?'))} seed {h.get('seed', '?')}"
            studies.setdefault(label, []).append((h["trial"], h["best_so_far_us"]))
    importance = sorted((cache.get("importance") or {}).items(), key=lambda kv: kv[1])
    if not studies and not importance:
        return False
    fig, (hist, imp) = _figure(2)
    for label, points in sorted(studies.items()):
        hist.plot(*zip(*sorted(points)), drawstyle="steps-post", label=label)
    if cache.get("default_time_us"):
        hist.axhline(cache["default_time_us"], color="grey", linestyle=":", label="default")
    if exhaustive_us:
        hist.axhline(exhaustive_us, color="k", linestyle="--", label="exhaustive best")
    if not studies:
        hist.text(0.5, 0.5, "no tuning history", ha="center", transform=hist.transAxes)
    hist.xaxis.set_major_locator(MaxNLocator(integer=True))
    hist.set_xlabel("trial")
    hist.set_ylabel("best time so far (us)")
    hist.set_title(f"{cache['kernel']} {shape_text(cache.get('shape'))}")
    hist.grid(True, alpha=0.3)
    if studies or cache.get("default_time_us") or exhaustive_us:
        hist.legend(fontsize=7)
    if importance:
        imp.barh([k for k, _ in importance], [v for _, v in importance], color="C0")
    else:
        imp.text(0.5, 0.5, "no importance recorded", ha="center", transform=imp.transAxes)
    imp.set_xlabel("importance")
    imp.set_title("parameter importance")
    fig.suptitle(f"tuning {cache['kernel']} on {gpu}")
    fig.savefig(path, dpi=100)
    return True


@_drawn
def quality(entry: dict[str, Any], gpu: str, path: Path) -> bool:
    """Budget against the best found as % of the reference best, per sampler: each seed's
    search as faint markers, their median as a line; the op's point today and the 3% line
    marked. False (and no file) when no sampler has a complete budget."""
    budgets = entry.get("budgets") or []
    curves = {name: c for name, c in (entry.get("samplers") or {}).items()
              if any(v is not None for row in c.get("percent") or () for v in row)}
    if not budgets or not curves:
        return False
    fig, (ax,) = _figure(1, width=6.4, height=4.2)
    for i, (name, c) in enumerate(sorted(curves.items())):
        color = f"C{i}"
        for row in c["percent"]:
            ax.plot([b for b, v in zip(budgets, row) if v is not None],
                    [v for v in row if v is not None], color=color, marker=".", linestyle="",
                    alpha=0.35)
        median = [(b, m) for b, m in zip(budgets, c.get("median_percent") or ()) if m is not None]
        if median:
            ax.plot(*zip(*median), color=color, marker="o", label=f"{name} (median of seeds)")
    within = entry.get("within", 0.03)
    ax.axhline(100 / (1 + within), color="grey", linestyle=":",
               label=f"within {100 * within:g}% of the reference")
    running = (entry.get("running") or {}).get("percent")
    if running is not None:
        ax.axhline(running, color="k", linestyle="--", label="the op's point today (shipped)")
    ax.set_xscale("log")
    ax.minorticks_off()  # the budgets are the ticks
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("trials")
    ax.set_ylabel("best found, % of the reference best")
    # the template on a line of its own: tasks of one kernel and shape differ only there
    ax.set_title(f"{entry.get('kernel', '?')} {shape_text(entry.get('shape'))}\n"
                 f"{shape_text(entry.get('template'))}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"search quality on {gpu}")
    fig.savefig(path, dpi=100)
    return True


@_drawn
def smoke_losses(result: dict[str, Any], gpu: str, path: Path) -> bool:
    """The smoke training's loss per step (log scale), with the float64 reference's first steps
    and the halving line. False (and no file) when the record holds no losses."""
    losses = [v for v in result.get("losses") or () if isinstance(v, (int, float))]
    if not losses:
        return False
    fig, (ax,) = _figure(1, width=6.4)
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, color="C0", label="GPU kernels (float32)")
    reference = result.get("reference_losses") or []
    if reference:
        ax.plot(range(1, len(reference) + 1), reference, "k.", label="float64 reference")
    ax.axhline(0.5 * losses[0], color="grey", linestyle=":", label="half the first loss")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"smoke training: loss per step on {gpu}")
    fig.savefig(path, dpi=100)
    return True
