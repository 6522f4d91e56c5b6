"""Exhaustive mode's batch phase: time every feasible point of a task back to back (the
variants are compiled beforehand), then validate. The study then gets one trial per point
from the cache (``study.record_exhaustive``), so nothing is timed twice."""
from __future__ import annotations

from .budget import Budget
from .progress import Progress
from .session import Session
from .spaces import all_points


def prefill(session: Session, budget: Budget, progress: Progress) -> bool:
    """Evaluate every point not in the cache yet (the default first); False when the budget ran
    out first (what was timed is kept in the cache; validation waits for the next run)."""
    pending = [p for p in all_points(session.task.space) if session.cache.get(p) is None]
    with progress.bar(len(pending), f"{session.task.label()} timing", unit="config") as bar:
        for point in pending:
            if budget.expired():
                return False
            bar.candidate(point)
            session.evaluate(point)
            best = min((e.time_us for e in session.cache.evaluations if e.counts), default=None)
            bar.done(best)
    session.settle()
    return True
