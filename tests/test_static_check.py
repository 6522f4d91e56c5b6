"""CPU: templating renders, the default variants compile with plain nvcc for every target arch
with no atomic instruction and no spills, and the PTX scanner catches atomics."""
import shutil

import pytest

from pycuda_heads.catalog import catalog
from pycuda_heads.core.source import (
    arg_types,
    cu_dir,
    family_source,
    render,
)
from pycuda_heads.verify.static_check import (
    DEFAULT_ARCHS,
    check_kernel,
    find_atomics,
    jobs,
    parse_ptxas,
)

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
# the model's head shape, where every FrdHead engine runs
HEAD = {"D_IN": 128, "FRD_HIDDEN": 128, "N_HORIZONS": 5, "N_ATOMS": 21}


def test_sources_are_found_and_render_self_contained():
    assert all((cu_dir() / f"{f}.cu").is_file() for f in catalog().families())
    src = render("pool", {"N_HORIZONS": 5, "HIDDEN_DIM": 128, "BLOCK": 128, "VEC": 4, "UNROLL": 2})
    assert "#define HIDDEN_DIM 128\n" in src and "#include" not in src
    assert "__device__ __forceinline__ float warp_sum" in src


def test_an_include_with_a_comment_after_it_is_inlined(tmp_path):
    (tmp_path / "toy.cu").write_text('#include "heads_common.cuh"  // warp_sum\n')
    src = family_source("toy", tmp_path)
    assert "#include" not in src and "__device__ __forceinline__ float warp_sum" in src


def test_render_rejects_unknown_family():
    with pytest.raises(ValueError, match="unknown kernel family"):
        render("nope", {})


@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_every_entry_is_in_its_source_with_passable_arguments(kernel):
    spec = catalog()[kernel]
    source = family_source(spec.family, spec.source_dir)
    assert all(arg_types(source, e) for e in spec.entries(spec.space.default))


def test_default_jobs_cover_every_kernel_on_every_arch():
    todo = jobs(catalog(), False, DEFAULT_ARCHS)
    assert {(spec.id, arch) for spec, _, arch in todo} == {
        (k, a) for k in catalog().specs for a in DEFAULT_ARCHS}
    assert all(params == dict(spec.space.default) for spec, params, _ in todo)


@needs_nvcc
@pytest.mark.parametrize("arch", DEFAULT_ARCHS)
@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_default_variant_has_no_atomics_or_spills(kernel, arch):
    spec = catalog()[kernel]
    report = check_kernel(spec, dict(spec.space.default), arch)
    assert report.ok, report.problems()
    assert set(report.entries) == set(spec.entries(spec.space.default))
    assert all(0 < e.registers <= 255 for e in report.entries.values())


# launches a call makes at each engine: a role's (WGMMA 1: the row launch, then its own); the
# backward's (both stages' in turn; WGMMA 2: the row products' one, then two weight gradients)
_LAUNCHES = {"frdhead.backward": {0: 2, 1: 4, 2: 3}}


def _engine_points():
    """Every FrdHead role at each engine its space has, at the suite head's shape."""
    for kernel in ("frdhead.forward", "frdhead.forward_loss", "frdhead.grad_w2", "frdhead.grad_w1",
                   "frdhead.backward"):
        spec = catalog()[kernel]
        for engine in spec.space.params["WGMMA"]:
            yield kernel, engine


@pytest.mark.parametrize("kernel,engine", list(_engine_points()))
def test_the_entries_a_variant_launches_are_in_its_module(kernel, engine):
    """Op.entries names real entries of the module that variant renders, each with arguments
    the launch can pass: what identity and the static check hold a variant to."""
    spec = catalog()[kernel]
    params = spec.space.complete({"WGMMA": engine}, HEAD)
    source = render(spec.family, {**HEAD, **params}, spec.source_dir)
    entries = spec.entries(params)
    assert len(entries) == _LAUNCHES.get(kernel, {0: 1, 1: 2, 2: 1})[engine]
    assert all(arg_types(source, e) for e in entries)


@needs_nvcc
def test_a_wgmma_variant_is_checked_on_the_entries_it_launches():
    spec = catalog()["frdhead.grad_w1"]
    params = spec.space.complete({"WGMMA": 1, "BK": 16, "OCC": 2}, HEAD)
    report = check_kernel(spec, params, "sm_90", HEAD)
    assert set(report.entries) == {"frdhead_wg_grad_h_t", "frdhead_wg_grad_w1"}
    assert report.ok, report.problems()


def test_atomic_scanner_finds_atomics_and_reductions():
    ptx = """
    ld.global.f32 %f1, [%rd1];
    atom.global.add.f32 %f2, [%rd2], %f1;
    @%p1 red.global.add.u32 [%rd3], 1;
    redux.sync.add.s32 %r1, %r2, 0xffffffff;
    cp.reduce.async.bulk.global.shared::cta.add.f32 [%rd4], [%r5], 64;
    """
    assert find_atomics(ptx) == ["atom.global.add.f32", "cp.reduce.async.bulk.global.shared::cta.add.f32",
                                 "red.global.add.u32"]
    assert find_atomics("ld.global.f32 %f1, [%rd1];\nst.global.f32 [%rd2], %f1;") == []


def test_ptxas_log_parsing():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'pool_forward' for 'sm_90'
ptxas info    : Function properties for pool_forward
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 2048 bytes smem, 380 bytes cmem[0]
"""
    e = parse_ptxas(log)["pool_forward"]
    assert (e.registers, e.stack_bytes, e.spill_store_bytes, e.spill_load_bytes,
            e.static_shared_bytes) == (80, 8, 4, 12, 2048)


@needs_nvcc
def test_an_nvcc_warning_fails_the_variant(tmp_path):
    """What a user's compile would print counts against the variant: two dynamic shared-memory
    declarations of different linkage (FrdHead's warning 1556 until it was fixed)."""
    (tmp_path / "warn.cu").write_text('''#include "heads_common.cuh"
template <int N> __device__ void stage(float* out) {
    extern __shared__ float4 smem4[];
    out[threadIdx.x] = reinterpret_cast<float*>(smem4)[N];
}
extern "C" __global__ void warn_forward(float* out) {
    extern __shared__ float4 smem4[];
    stage<1>(out);
    out[0] += reinterpret_cast<float*>(smem4)[0];
}
''')
    from pycuda_heads.verify.static_check import check_variant
    report = check_variant("warn", {"BLOCK": 32}, source_dir=tmp_path)
    assert not report.ok
    assert any("nvcc:" in p and "1556" in p for p in report.problems()), report.problems()
