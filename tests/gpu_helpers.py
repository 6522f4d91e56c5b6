"""Shared pieces of the per-op GPU tests."""
from pycuda_heads.cases import Case
from pycuda_heads.checks import validate_case
from pycuda_heads.registry import KERNELS
from pycuda_heads.validation import grid


def grid_params(kernel):
    """pytest params: the default variant over the odd-shape grid and the suite shapes."""
    import pytest
    return [pytest.param(t, s, id=",".join(f"{k}={v}" for k, v in {**t, **s}.items()))
            for t, s in grid(kernel)]


def assert_variant_passes(kernel, template, shape, params=None):
    params = params or dict(KERNELS[kernel].space.default)
    result = validate_case(Case(kernel, shape, params, template))
    errs = {k: v.get("max_rel_err") for k, v in result["checks"].items() if "max_rel_err" in v}
    assert result["passed"], f"{kernel} {template} {shape}: {result['failures']} (errors {errs})"
    return result
