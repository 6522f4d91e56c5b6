"""CPU: FrdHead's backward spaces: the role ``backward`` against its two stages', and a partial
launch override. grad_w2's default weight-gradient
knobs (BK 32, two blocks an SM) need more shared memory than an SM has under WGMMA, so
`{"WGMMA": 1}` resolves, as the op resolves a user's point, to the nearest point that keeps it
and fits; a full point that does not fit stays as given (the op then raises)."""
from __future__ import annotations

import pytest

from pycuda_heads.core.space import SM90_MAX_SHARED_BYTES
from pycuda_heads.ops.frdhead import (BACKWARD_SPACE, GRAD_W1_SPACE, GRAD_W2_SPACE, FrdHead,
                                      wr_rows_shared_bytes)

HEAD = {"D_IN": 128, "FRD_HIDDEN": 128, "N_HORIZONS": 5, "N_ATOMS": 21}
SHAPE = {"B": 8, "MAX_SHARED_BYTES": SM90_MAX_SHARED_BYTES}


@pytest.mark.parametrize("space", [GRAD_W2_SPACE, GRAD_W1_SPACE], ids=lambda s: s.kernel)
def test_a_partial_override_finds_a_point_that_fits(space):
    given = {"WGMMA": 1}
    completed = space.complete(given, HEAD)
    if space is GRAD_W2_SPACE:  # the default's BK and OCC (grad_w1's own rule moves them)
        assert space.violated(completed, HEAD, SHAPE) is not None
    point = space.nearest(completed, HEAD, SHAPE, keep=given)
    assert point["WGMMA"] == 1 and space.violated(point, HEAD, SHAPE) is None
    # as close to the default as fits: the row products' knobs stay the default's
    assert (point["WG"], point["CS"]) == (completed["WG"], completed["CS"])


def test_a_full_point_that_does_not_fit_stays_as_given():
    full = {**GRAD_W2_SPACE.default, "WGMMA": 1, "BK": 32, "OCC": 2}  # 2 x 168448 B
    assert GRAD_W2_SPACE.nearest(full, HEAD, SHAPE, keep=full) == full


def test_the_backward_space_holds_both_stages_rules():
    """The backward runs where both stages run at its point (under WGMMA 2 their weight
    gradients, WGMMA 1's, beside the FP16 row launch, which fits at either warpgroup count);
    WGMMA 2 is the head shape's only, and launches the row products, then the two weight
    gradients."""
    def fits(space, p):
        return space.violated(p, HEAD, SHAPE) is None
    engines = set()
    for p in BACKWARD_SPACE.points(HEAD):
        engines.add(p["WGMMA"])
        stages = {**p, "WGMMA": 1} if p["WGMMA"] == 2 else p
        both = fits(GRAD_W2_SPACE, stages) and fits(GRAD_W1_SPACE, stages)
        assert fits(BACKWARD_SPACE, p) == both, p
        if p["WGMMA"] == 2:
            assert p["CS"] == 4 and wr_rows_shared_bytes(p, HEAD) <= SM90_MAX_SHARED_BYTES
            assert FrdHead.entries("backward", p) == ("frdhead_f16_rows", "frdhead_wg_grad_w2",
                                                      "frdhead_wg_grad_w1")
            continue
        assert FrdHead.entries("backward", p) == (FrdHead.entries("grad_w2", p)
                                                  + FrdHead.entries("grad_w1", p))
    odd = {**HEAD, "D_IN": 37}
    assert engines == {0, 1, 2} and all(p["WGMMA"] == 0 for p in BACKWARD_SPACE.points(odd))
