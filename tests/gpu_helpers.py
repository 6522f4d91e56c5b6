"""Shared pieces of the per-op GPU tests."""
from pycuda_heads.catalog import catalog
from pycuda_heads.verify.cases import Case
from pycuda_heads.verify.checks import validate_case


def grid_params(kernel):
    """pytest params: the default variant over the odd-shape grid and the suite shapes."""
    import pytest
    return [pytest.param(t, s, id=",".join(f"{k}={v}" for k, v in {**t, **s}.items()))
            for t, s in catalog().grid(kernel)]


def assert_variant_passes(kernel, template, shape, params=None):
    spec = catalog()[kernel]
    params = params or spec.space.nearest(spec.space.default, template, shape)
    result = validate_case(Case(spec, shape, params, template))
    errs = {k: v.get("max_rel_err") for k, v in result["checks"].items() if "max_rel_err" in v}
    assert result["passed"], f"{kernel} {template} {shape}: {result['failures']} (errors {errs})"
    return result


def oracles(kernel, template=None, params=None):
    """The kernel's own parity test or oracles for a variant (the default when params is None)."""
    from pycuda_heads.catalog import SUITE_TEMPLATE
    spec = catalog()[kernel]
    template = spec.template(template or SUITE_TEMPLATE)
    params = spec.space.complete(params, template)
    return spec.oracles(lambda t: spec.make_op(t, params), template)
