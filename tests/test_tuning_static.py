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


def sample(spec) -> list[tuple[dict, dict]]:
    """(template, point): the default, the shipped entries (each at the template it was tuned
    at, so a layout only wide heads take is checked too), then a greedy cover of every
    (layout, knob, value) over the suite template's points in a seeded order."""
    suite = spec.template(SUITE_TEMPLATE)
    points = spec.space.points(suite)
    table = load_table("nvidia-h200") or {"entries": []}
    shipped = [(t, spec.space.complete(e["params"], t)) for e in table["entries"]
               if e["kernel"] == spec.id
               for t in [spec.template({**SUITE_TEMPLATE, **e["template"]})]]
    chosen = [dict(spec.space.default)] + [p for t, p in shipped if t == suite and p in points]
    random.Random(spec.id).shuffle(points)
    chosen += greedy_cover(points, chosen,
                           lambda p: [(p.get("LAYOUT"), k, v) for k, v in p.items()])
    pairs = [(suite, p) for p in chosen] + [(t, p) for t, p in shipped if t != suite]
    return list({_key(t, p): (t, p) for t, p in pairs}.values())


def _key(template: dict, point: dict) -> tuple[str, str]:
    return dims_label(template), point_key(point)


@pytest.fixture(scope="module")
def reports():
    """(kernel, template label, point key) -> StaticReport for the sampled points."""
    groups = defaultdict(list)
    for spec in catalog():
        for template, point in sample(spec):
            # points that are one compiled variant share a thread: the disk cache is written once
            groups[f"{spec.family}:{dims_label({**template, **point})}"].append(
                (spec.id, template, point))

    def check(group):
        return [(k, t, p, check_kernel(catalog()[k], p, ARCH, t)) for k, t, p in group]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = [r for rs in pool.map(check, groups.values()) for r in rs]
    return {(k, *_key(t, p)): r for k, t, p, r in done}


@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_every_point_passes_the_static_check_or_is_rejected_with_a_reason(reports, kernel):
    spec = catalog()[kernel]
    pairs = sample(spec)
    assert pairs
    for template, point in pairs:
        report = reports[(kernel, *_key(template, point))]
        assert report.ok or report.problems(), point
        for problem in report.problems():
            assert problem.startswith("atomic instruction") or " spills " in problem \
                or problem == "no kernel entry was compiled", problem
    assert reports[(kernel, *_key(spec.template(SUITE_TEMPLATE), spec.space.default))].ok
    table = load_table("nvidia-h200") or {"entries": []}
    for e in table["entries"]:  # what ships passes outright
        if e["kernel"] == kernel:
            template = spec.template({**SUITE_TEMPLATE, **e["template"]})
            params = spec.space.complete(e["params"], template)  # it may predate a knob
            assert reports[(kernel, *_key(template, params))].ok, e


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
