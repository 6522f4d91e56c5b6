"""CPU with nvcc: the points of every catalog search space pass the static check or are
rejected by it with a reason, and the tuner turns a rejection into an INFEASIBLE reason.

The pool's spaces hold thousands of points, each a compile of a few seconds, so the check covers
a sample: the default, every shipped tuned entry and, per layout, points that together take
every value of every knob (the tuner checks each point it tries anyway)."""
import os
import random
import shutil
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from pycuda_heads.tuning import constraints
from pycuda_heads.tuning.constraints import Feasibility, spec_static
from pycuda_heads.tuning.spaces import TuningTask, greedy_cover, point_key

from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.core.tuned import load_table
from pycuda_heads.records import dims_label
from pycuda_heads.verify import static_check
from pycuda_heads.verify.static_check import StaticReport, check_kernel

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None,
                                reason="the static check needs nvcc and ptxas on the PATH")
ARCH = "sm_90"


def sample(spec) -> list[dict]:
    """The default, the shipped entries at the suite template, then a greedy cover of every
    (layout, knob, value) over the points in a seeded order."""
    template = spec.template(SUITE_TEMPLATE)
    points = spec.space.points(template)
    table = load_table("nvidia-h200") or {"entries": []}
    chosen = [dict(spec.space.default)] + [
        e["params"] for e in table["entries"]
        if e["kernel"] == spec.id and e["template"] == template and e["params"] in points]
    random.Random(spec.id).shuffle(points)
    chosen += greedy_cover(points, chosen,
                           lambda p: [(p.get("LAYOUT"), k, v) for k, v in p.items()])
    return list({point_key(p): p for p in chosen}.values())


@pytest.fixture(scope="module")
def reports():
    """(kernel, point key) -> StaticReport for the sampled points of every space."""
    groups = defaultdict(list)
    for spec in catalog():
        template = spec.template(SUITE_TEMPLATE)
        for point in sample(spec):
            # points that are one compiled variant share a thread: the disk cache is written once
            groups[f"{spec.family}:{dims_label({**template, **point})}"].append((spec.id, point))

    def check(group):
        return [(k, p, check_kernel(catalog()[k], p, ARCH)) for k, p in group]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = [r for rs in pool.map(check, groups.values()) for r in rs]
    return {(k, point_key(p)): r for k, p, r in done}


@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_every_point_passes_the_static_check_or_is_rejected_with_a_reason(reports, kernel):
    spec = catalog()[kernel]
    points = sample(spec)
    assert points
    for point in points:
        report = reports[(kernel, point_key(point))]
        assert report.ok or report.problems(), point
        for problem in report.problems():
            assert problem.startswith("atomic instruction") or " spills " in problem \
                or problem == "no kernel entry was compiled", problem
    assert reports[(kernel, point_key(spec.space.default))].ok


def test_feasibility_runs_the_static_check_for_every_point_of_a_task():
    spec = catalog()["gate.forward"]
    task = TuningTask.from_spec(spec, spec.suite[0], "G", "g")
    feas = Feasibility(task, spec_static(task, ARCH))
    points = task.space.points(task.template, task.shape)
    constraints.warm([(feas, p) for p in points], workers=os.cpu_count() or 1)
    for point in points:
        report = check_kernel(spec, point, ARCH)
        assert feas(point) == (None if report.ok else "static check: "
                               + "; ".join(report.problems()))


def test_a_rejected_point_gets_the_static_checks_reason(monkeypatch):
    task = TuningTask.from_spec(catalog()["pool.forward"], {"B": 2, "K": 8}, "G", "g")

    def atomic(spec, params, arch, template):
        return StaticReport(spec.family, {}, arch, "v", atomics=["atom.global.add.f32"])

    monkeypatch.setattr(static_check, "check_kernel", atomic)
    reason = Feasibility(task, spec_static(task, ARCH))(dict(task.space.default))
    assert reason == "static check: atomic instruction atom.global.add.f32; " \
                     "no kernel entry was compiled"


def test_a_point_that_does_not_compile_is_infeasible(monkeypatch):
    task = TuningTask.from_spec(catalog()["pool.forward"], {"B": 2, "K": 8}, "G", "g")

    def broken(spec, params, arch, template):
        raise RuntimeError("nvcc failed on pool:\nerror: expected a ';'")

    monkeypatch.setattr(static_check, "check_kernel", broken)
    reason = Feasibility(task, spec_static(task, ARCH))(dict(task.space.default))
    assert reason.startswith("static check: does not compile: nvcc failed")
