"""CPU: FrdHead's backward spaces: the role ``backward`` against its two stages', and a partial
launch override. grad_w2's default weight-gradient
knobs (BK 32, two blocks an SM) need more shared memory than an SM has under WGMMA, so
`{"WGMMA": 1}` resolves, as the op resolves a user's point, to the nearest point that keeps it
and fits; a full point that does not fit stays as given (the op then raises)."""
from __future__ import annotations

import pytest

from pycuda_heads.core.space import SM90_MAX_SHARED_BYTES
from pycuda_heads.ops.frdhead import (BACKWARD_SPACE, GRAD_W1_SPACE, GRAD_W2_SPACE, FrdHead,
                                      wr_grad_w1_shared_bytes, wr_rows_shared_bytes)

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
    """Under WGMMA 0 and 1 the backward runs where both stages run at its point. Under WGMMA 2
    (the head shape's only) it launches the FP16 row products, which fit at either warpgroup
    count, then grad_w2's weight gradient (WGMMA 1's) and grad_w1's over the masked dpre, which
    has no mask tiles: it runs where those two fit OCC blocks an SM."""
    def fits(space, p):
        return space.violated(p, HEAD, SHAPE) is None
    engines = set()
    for p in BACKWARD_SPACE.points(HEAD):
        engines.add(p["WGMMA"])
        if p["WGMMA"] == 2:
            occ = p["OCC"] * (wr_grad_w1_shared_bytes(p, HEAD) + 1024) <= SHAPE[
                "MAX_SHARED_BYTES"] + 1024
            assert fits(BACKWARD_SPACE, p) == (fits(GRAD_W2_SPACE, {**p, "WGMMA": 1}) and occ)
            assert p["CS"] == 4 and wr_rows_shared_bytes(p, HEAD) <= SM90_MAX_SHARED_BYTES
            assert wr_grad_w1_shared_bytes(p, HEAD) < GRAD_W1_SPACE.shared_bytes(
                {**p, "WGMMA": 1}, HEAD)
            assert FrdHead.entries("backward", p) == ("frdhead_f16_rows", "frdhead_wg_grad_w2",
                                                      "frdhead_wg_grad_w1_dpre")
            continue
        both = fits(GRAD_W2_SPACE, p) and fits(GRAD_W1_SPACE, p)
        assert fits(BACKWARD_SPACE, p) == both, p
        assert FrdHead.entries("backward", p) == (FrdHead.entries("grad_w2", p)
                                                  + FrdHead.entries("grad_w1", p))
    odd = {**HEAD, "D_IN": 37}
    assert engines == {0, 1, 2} and all(p["WGMMA"] == 0 for p in BACKWARD_SPACE.points(odd))
