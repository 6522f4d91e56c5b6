"""Shared pieces of the GPU tests."""
from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.verify.cases import Case
from pycuda_heads.verify.checks import validate_case

# validate_case of each kernel's default variant by point: test_kernels.py's tests of one point
# and the families' assertions on its oracles read one GPU run.
_DEFAULT_RUNS = {}


def default_params(kernel, template, shape):
    """The launch parameters the op runs without a tuned entry: the nearest valid default."""
    spec = catalog()[kernel]
    return spec.space.nearest(spec.space.default, template, shape)


def default_run(kernel, template, shape):
    """validate_case of the default variant at (template, shape), run once per process."""
    key = (kernel, tuple(sorted(template.items())), tuple(sorted(shape.items())))
    if key not in _DEFAULT_RUNS:
        params = default_params(kernel, template, shape)
        _DEFAULT_RUNS[key] = validate_case(Case(catalog()[kernel], shape, params, template))
    return _DEFAULT_RUNS[key]


def suite_point(kernel):
    """(template, shape) of the kernel's first suite entry at the suite template: where its
    oracles are checked."""
    spec = catalog()[kernel]
    template = spec.template(SUITE_TEMPLATE)
    point = next(((t, s) for t, s in spec.suite_points(SUITE_TEMPLATE) if t == template), None)
    if point is None:
        raise ValueError(f"{kernel}: no suite entry at the suite template {template}")
    return point


def oracle_checks(kernel, result):
    """The checks of a validate_case result that the kernel's oracles returned."""
    own = {f"reference.{name}" for name in catalog()[kernel].writes} | {"determinism", "error"}
    return {k: v for k, v in result["checks"].items() if k not in own}


def suite_oracles(kernel):
    """The kernel's oracle checks at its suite point (the default variant's run)."""
    result = default_run(kernel, *suite_point(kernel))
    assert "error" not in result["checks"], f"{kernel}: {result['checks']['error']['detail']}"
    return oracle_checks(kernel, result)


def assert_variant_passes(kernel, template, shape, params):
    """Every check of validate_case for the variant ``params``."""
    result = validate_case(Case(catalog()[kernel], shape, params, template))
    errs = {k: v.get("max_rel_err") for k, v in result["checks"].items() if "max_rel_err" in v}
    assert result["passed"], f"{kernel} {template} {shape}: {result['failures']} (errors {errs})"


def oracles(kernel, params):
    """The kernel's oracles for the variant ``params``, at the suite template."""
    spec = catalog()[kernel]
    template = spec.template(SUITE_TEMPLATE)
    params = spec.space.complete(params, template)
    return spec.oracles(lambda t: spec.make_op(t, params), template)


def assert_pdl_gives_plain_bits(monkeypatch, chain):
    """``chain()`` -> (op, GPUArrays) gives the same bits with programmatic dependent launch as
    with plain launches (the op's kernels are DriverKernels with pdl, then plain Kernels)."""
    import pytest
    from pycuda_heads.core import compile as core_compile
    from pycuda_heads.core.runtime import RUNTIME
    if not core_compile.pdl_supported():
        pytest.skip("programmatic dependent launch needs compute capability 9.0 and cuda-bindings")

    def run():
        op, outs = chain()
        is_pdl = {getattr(k, "pdl", False) for k in op._kernels.values()}
        return is_pdl, [o.get().tobytes() for o in outs]

    kernels, pdl = run()
    assert kernels == {True}
    monkeypatch.setattr(RUNTIME, "pdl", False)
    kernels, plain = run()
    assert kernels == {False}
    assert pdl == plain
