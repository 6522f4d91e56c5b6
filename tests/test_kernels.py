"""GPU: every kernel of the catalog, its default variant over its validation grid: the float64
references, every output element written, bitwise determinism, and its numerical gradients and
analytical oracles. All of it is derived from the catalog, so a new
family is covered without editing this file; the family files keep what is their own."""
import subprocess
import sys
from pathlib import Path

import pytest

from pycuda_heads.catalog import catalog
from gpu_helpers import default_params, default_run, oracle_checks

# On each GPU test, not on the module: the coverage test at the end runs without a GPU.
gpu = pytest.mark.gpu


def _label(template, shape):
    return ",".join(f"{k}={v}" for k, v in {**template, **shape}.items())


# Module scope: pytest runs the tests of one point one after another, so they read one run of
# validate_case (under pytest-xdist a worker takes neighbouring tests).
over_grid = pytest.mark.parametrize(
    "kernel,template,shape", [pytest.param(s.id, t, shape, id=f"{s.id}-{_label(t, shape)}")
                              for s in catalog() for t, shape in catalog().grid(s.id)],
    scope="module")
GRID_TESTS = ("test_reference", "test_every_element_written", "test_determinism", "test_oracles")


def _where(kernel, template, shape):
    params = default_params(kernel, template, shape)
    return f"{kernel} at {_label(template, shape)} (params {params})"


def _numbers(check):
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in check.items() if k != "passed")


def _checks(kernel, template, shape, names):
    """The named checks of the point's run; those it never reached fail with what stopped it."""
    checks = default_run(kernel, template, shape)["checks"]
    missing = [n for n in names if n not in checks]
    assert not missing, (f"{_where(kernel, template, shape)}: no {', '.join(missing)}: "
                         f"{checks.get('error', {}).get('detail')}")
    return {n: checks[n] for n in names}


def _reference_checks(kernel, template, shape):
    return _checks(kernel, template, shape,
                   [f"reference.{name}" for name in catalog()[kernel].writes])


@gpu
@over_grid
def test_reference(kernel, template, shape):
    failed = [f"{name}: {_numbers(c)}"
              for name, c in _reference_checks(kernel, template, shape).items() if not c["passed"]]
    assert not failed, f"{_where(kernel, template, shape)}: " + "; ".join(failed)


@gpu
@over_grid
def test_every_element_written(kernel, template, shape):
    """Outputs start as NaN (poisoned): a non-finite element where the reference is finite was
    never written."""
    unwritten = [f"{name}: {_numbers(c)}" for name, c in
                 _reference_checks(kernel, template, shape).items() if not c["all_written"]]
    assert not unwritten, (f"{_where(kernel, template, shape)}: non-finite elements left in "
                           "poisoned outputs: " + "; ".join(unwritten))


@gpu
@over_grid
def test_determinism(kernel, template, shape):
    check = _checks(kernel, template, shape, ["determinism"])["determinism"]
    assert check["passed"], (f"{_where(kernel, template, shape)}: determinism: a second launch "
                             "on the same inputs gave other bits")


@gpu
@over_grid
def test_oracles(kernel, template, shape):
    """The kernel's numerical-gradient and analytical oracles at the point's template and the
    launch parameters its shape gets (the oracles draw their own inputs)."""
    if catalog()[kernel].oracles is None:
        pytest.skip(f"{kernel} declares no oracles (its KernelSpec has oracles=None)")
    result, where = default_run(kernel, template, shape), _where(kernel, template, shape)
    assert "error" not in result["checks"], f"{where}: {result['checks']['error']['detail']}"
    checks = oracle_checks(kernel, result)
    assert checks, f"{where}: its oracles returned no check"
    failed = [f"{name}: {_numbers(c)}" for name, c in checks.items() if not c["passed"]]
    assert not failed, f"{where}: oracles failed: " + "; ".join(failed)


def test_collected_items_cover_every_kernel_and_grid_point():
    """Collected as pytest does (no GPU, no PyCUDA needed): the grid tests at every point of
    every kernel's grid, the oracles of every kernel, nothing else."""
    cat = catalog()
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", __file__],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    collected = {line.split("::", 1)[1] for line in run.stdout.splitlines() if "::" in line}
    want = {f"{test}[{s.id}-{_label(t, shape)}]"
            for test in GRID_TESTS for s in cat for t, shape in cat.grid(s.id)}
    assert collected == want | {test_collected_items_cover_every_kernel_and_grid_point.__name__}
