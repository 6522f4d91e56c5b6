"""CPU: every shape in the pool's supported range has a valid launch point, found the way the
op finds it (the default, else its nearest valid point); both kernels run LAYOUT 2 across the
range but the widest heads, which LAYOUT 1 serves by default (LAYOUT 5 the backward where its
horizons and columns fit) and the tensor-core layouts where tuned."""
from __future__ import annotations

import pytest

from pycuda_heads.catalog import catalog
from pycuda_heads.core.space import SM90_MAX_SHARED_BYTES
from pycuda_heads.ops.pool import (BACKWARD_SPACE, FORWARD_SPACE, MAX_HIDDEN_DIM, MAX_HORIZONS,
                                   MAX_K, backward_shared_bytes, forward_shared_bytes)

HORIZONS = (1, 2, 5, 8, 17, MAX_HORIZONS)
DIMS = (1, 2, 30, 64, 127, 128, 256, 500, 512, 1000, MAX_HIDDEN_DIM)
KEYS = (1, 64, 5000, MAX_K)


@pytest.mark.parametrize("space", [FORWARD_SPACE, BACKWARD_SPACE], ids=lambda s: s.kernel)
@pytest.mark.parametrize("h", HORIZONS)
def test_every_shape_in_range_has_a_valid_point(space, h: int) -> None:
    for d in DIMS:
        template = {"N_HORIZONS": h, "HIDDEN_DIM": d}
        for k in KEYS:
            shape = {"B": 1, "K": k, "MAX_SHARED_BYTES": SM90_MAX_SHARED_BYTES}
            point = space.nearest(space.default, template, shape)
            assert space.violated(point, template, shape) is None, (template, k, point)


def test_default_layouts_and_where_layout_1_takes_over() -> None:
    suite = {"N_HORIZONS": 5, "HIDDEN_DIM": 128}
    shape = {"B": 4096, "K": 256}
    assert FORWARD_SPACE.nearest(FORWARD_SPACE.default, suite, shape)["LAYOUT"] == 2
    assert BACKWARD_SPACE.nearest(BACKWARD_SPACE.default, suite, shape)["LAYOUT"] == 2
    # the backward's per-lane rows (grad_ctx and grad_q_h of every horizon) fit LAYOUT 2 at
    # H=2, D=1024 only with no minimum of blocks per SM (all 255 registers)
    for template, k, forward, backward in (({"N_HORIZONS": 8, "HIDDEN_DIM": 256}, 64, 2, 2),
                                           # the backward's default MIN_BLOCKS 3 is one
                                           # LAYOUT 4 takes: its nearest valid point
                                           ({"N_HORIZONS": 32, "HIDDEN_DIM": 128}, 64, 1, 4),
                                           # LAYOUT 5 keeps the backward's MIN_BLOCKS 3
                                           ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, 64, 1, 5),
                                           ({"N_HORIZONS": 2, "HIDDEN_DIM": 1024}, 64, 2, 2),
                                           ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, 60000, 2, 2)):
        shape = {"B": 1, "K": k}
        assert FORWARD_SPACE.nearest(FORWARD_SPACE.default, template, shape)["LAYOUT"] == forward
        assert BACKWARD_SPACE.nearest(BACKWARD_SPACE.default, template, shape)["LAYOUT"] == backward


def test_layouts_pin_the_knobs_they_do_not_read() -> None:
    """No two valid points of one layout differ only in a knob that layout ignores."""
    layout2 = ("BLOCK", "VEC", "GROUP", "TEAMS", "GRID", "MIN_BLOCKS", "STAGES", "GROUP_KEYS")
    for space, extra in ((FORWARD_SPACE, ("QREG", "SMEM_SCORES", "LANE_ACC")),
                         (BACKWARD_SPACE, ())):
        read = {0: ("BLOCK", "VEC", "UNROLL"), 1: ("BLOCK", "VEC", "UNROLL"), 2: layout2 + extra,
                3: ("BLOCK", "CHUNK"), 4: ("BLOCK", "GRID", "MIN_BLOCKS"),
                5: ("BLOCK", "GRID", "MIN_BLOCKS", "STAGES")}
        for template, layouts in (({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {0, 1, 2}),
                                  ({"N_HORIZONS": 16, "HIDDEN_DIM": 30}, {0, 1, 2}),
                                  ({"N_HORIZONS": 8, "HIDDEN_DIM": 128}, {0, 1, 2, 3, 4, 5}),
                                  ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, {1, 3, 5})):
            points = space.points(template)
            keys = [(p["LAYOUT"], *(p[k] for k in read[p["LAYOUT"]])) for p in points]
            assert len(keys) == len(set(keys)), space.kernel
            assert {p["LAYOUT"] for p in points} == layouts, space.kernel


def test_layout_5_shared_memory_matches_the_kernels_layout() -> None:
    """LAYOUT 5 at H=8, D=512, two slots of 16 keys: the forward holds the slots (rows of 516
    floats), 8 warps' partial scores (8 rows of 20 each), P (8 rows of 20) and two statistics a
    horizon; the backward's slots (rows of 512 floats, swizzled) also hold attn (8 x 20),
    beside G of two batch rows, the partials, DS and c. The shared memory does not grow with
    K."""
    template = {"N_HORIZONS": 8, "HIDDEN_DIM": 512}
    for k in (1, 128, 65536):
        point = FORWARD_SPACE.complete({"LAYOUT": 5, "BLOCK": 256, "STAGES": 2}, template)
        assert FORWARD_SPACE.violated(point, template) is None
        assert forward_shared_bytes(point, {**template, "K": k}) == 4 * (
            2 * 16 * 516 + 8 * 8 * 20 + 8 * 20 + 2 * 8)
        point = BACKWARD_SPACE.complete({"LAYOUT": 5, "BLOCK": 256, "STAGES": 2}, template)
        assert backward_shared_bytes(point, {**template, "K": k}) == 4 * (
            2 * (16 * 512 + 8 * 20) + 2 * 8 * 516 + 8 * 8 * 20 + 8 * 20 + 8)


def test_layout_6_runs_only_its_shape_and_is_the_wgmma_knob() -> None:
    """LAYOUT 6 has points at H=32, D=128 and K <= 64 only, at BLOCK 128 and 256, and WGMMA
    (built for sm_90a) is set exactly there. Its shared memory: q's halves, then per warpgroup
    two rows of 64 keys padded to 144 floats, P's halves and two 4 x 32 partials (forward), or
    one row, G's and DS's halves and a 4 x 32 partial (backward)."""
    template = {"N_HORIZONS": 32, "HIDDEN_DIM": 128}
    for space, bytes_of, per_wg in (
            (FORWARD_SPACE, forward_shared_bytes, 2 * 64 * 144 + 2 * 32 * 64 + 2 * 4 * 32),
            (BACKWARD_SPACE, backward_shared_bytes,
             64 * 144 + 2 * 32 * 128 + 2 * 32 * 64 + 4 * 32)):
        points = [p for p in space.points(template, {"B": 512, "K": 64}) if p["LAYOUT"] == 6]
        assert sorted(p["BLOCK"] for p in points) == [128, 256]
        for p in space.points(template, {"B": 512, "K": 64}):
            assert p["WGMMA"] == (p["LAYOUT"] == 6)
        for p in points:
            assert bytes_of(p, {**template, "K": 64}) == 4 * (
                2 * 32 * 128 + p["BLOCK"] // 128 * per_wg)
        for other, shape in (({"N_HORIZONS": 24, "HIDDEN_DIM": 128}, {"B": 512, "K": 64}),
                             ({"N_HORIZONS": 32, "HIDDEN_DIM": 256}, {"B": 512, "K": 64}),
                             (template, {"B": 512, "K": 65})):
            assert all(p["LAYOUT"] != 6 for p in space.points(other, shape)), (other, shape)


def test_layout_3_shared_memory_matches_the_kernels_layout() -> None:
    """The host's byte count for LAYOUT 3 follows the kernel's tiles: at H=32, D=128, CHUNK
    8192 (64 keys a chunk, 2 keys a thread, one D slice) the forward holds the queries and two
    chunks ((32 + 2*64) rows of 132 floats), 32x64 scores and 3x32 statistics."""
    template, shape = {"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"K": 64}
    point = FORWARD_SPACE.complete({"LAYOUT": 3, "BLOCK": 256, "CHUNK": 8192}, template)
    assert FORWARD_SPACE.violated(point, template) is None
    assert forward_shared_bytes(point, {**template, **shape}) == 4 * (160 * 132 + 32 * 64 + 96)
    point = BACKWARD_SPACE.complete({"LAYOUT": 3, "BLOCK": 256, "CHUNK": 8192}, template)
    assert backward_shared_bytes(point, {**template, **shape}) == 4 * (
        192 * 132 + 32 * 64 + 32 * 64 + 32)


def test_layout_4_shared_memory_matches_the_kernels_layout() -> None:
    """LAYOUT 4 holds the whole row: at H=32, D=128, K=60 (64 keys after rounding up to 16)
    the forward keeps ln (64 rows of 132 floats) and the scores (32 rows of 68), the backward
    also q and grad_ctx (32 rows of 132 each) and attn beside DS (32 rows of 68 each)."""
    template, shape = {"N_HORIZONS": 32, "HIDDEN_DIM": 128}, {"K": 60}
    forward = FORWARD_SPACE.complete({"LAYOUT": 4, "BLOCK": 256}, template)
    assert FORWARD_SPACE.violated(forward, template) is None
    assert forward_shared_bytes(forward, {**template, **shape}) == 4 * (64 * 132 + 32 * 68)
    backward = BACKWARD_SPACE.complete({"LAYOUT": 4, "BLOCK": 256, "GRID": 2}, template)
    assert BACKWARD_SPACE.violated(backward, template) is None
    assert backward_shared_bytes(backward, {**template, **shape}) == 4 * (
        128 * 132 + 64 * 68)
    # the tensor-core tiles: horizons in n8 tiles, D in m16 tiles over the warps, D <= 256
    for template in ({"N_HORIZONS": 12, "HIDDEN_DIM": 128}, {"N_HORIZONS": 32, "HIDDEN_DIM": 96},
                     {"N_HORIZONS": 8, "HIDDEN_DIM": 512}):
        assert FORWARD_SPACE.violated(forward, template) is not None


def test_layout_2_backward_ring_holds_every_key_of_a_step() -> None:
    """A backward ring slot holds the step's ln rows and their attn and grad_attn: at GROUP 16
    and GROUP_KEYS 2, 4 keys of 128 floats and 2x5x4 floats, in 4 slots a warp."""
    template, shape = {"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"K": 64}
    point = BACKWARD_SPACE.complete({"GROUP_KEYS": 2}, template)
    assert (point["GROUP"], point["STAGES"], point["BLOCK"]) == (16, 4, 128)
    slot = 4 * 128 + 40
    assert backward_shared_bytes(point, {**template, **shape}) == 4 * (4 * 4 * slot + 5 * 128)


def test_a_partial_launch_keeps_its_knobs_and_fills_the_rest_validly() -> None:
    suite = {"N_HORIZONS": 5, "HIDDEN_DIM": 128}
    for partial in ({"LAYOUT": 0}, {"LAYOUT": 1, "BLOCK": 512}, {"BLOCK": 32}, {"QREG": 0}):
        point = FORWARD_SPACE.complete(partial, suite)
        assert all(point[k] == v for k, v in partial.items())
        assert FORWARD_SPACE.violated(point, suite) is None, point


def test_wide_suite_entries_carry_their_own_template() -> None:
    tasks = [(t, s) for spec, t, s in catalog().tasks() if spec.id == "pool.backward"]
    assert ({"N_HORIZONS": 8, "HIDDEN_DIM": 512}, {"B": 1024, "K": 128}) in tasks
    assert ({"N_HORIZONS": 5, "HIDDEN_DIM": 128}, {"B": 64, "K": 4096}) in tasks
    cases = [c for c in catalog().bench_cases() if c.op == "pool" and c.pass_ == "fwd+bwd"]
    wide = next(c for c in cases if c.over == {"N_HORIZONS": 32, "HIDDEN_DIM": 128})
    assert wide.shape == {"B": 512, "K": 64} and wide.template["N_HORIZONS"] == 32
    assert wide.floor_bytes() > 0


@pytest.mark.parametrize("h,d", [(MAX_HORIZONS + 1, 128), (5, MAX_HIDDEN_DIM + 1)])
def test_model_sizes_outside_the_range_are_refused_before_any_device_work(h: int, d: int) -> None:
    import pycuda_heads as ph
    with pytest.raises(ValueError, match="must be at most"):
        ph.PerHorizonAttentionPool(h, d)
