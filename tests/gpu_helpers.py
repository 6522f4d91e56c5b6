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


def assert_pdl_gives_plain_bits(monkeypatch, chain):
    """``chain()`` -> (op, GPUArrays) gives the same bits with programmatic dependent launch as
    with plain launches (the op's kernels are PdlKernels, then plain Kernels)."""
    import pytest
    from pycuda_heads.core import compile as core_compile
    if not core_compile._pdl_supported():
        pytest.skip("programmatic dependent launch needs compute capability 9.0 and cuda-bindings")

    def run():
        op, outs = chain()
        return {type(k) for k in op._kernels.values()}, [o.get().tobytes() for o in outs]

    kernels, pdl = run()
    assert kernels == {core_compile.PdlKernel}
    monkeypatch.setattr(core_compile, "_PDL", [False])
    kernels, plain = run()
    assert kernels == {core_compile.Kernel}
    assert pdl == plain
