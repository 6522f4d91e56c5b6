"""The performance shape suite (DESIGN.md section 6) per tunable kernel, and the parity shapes."""
from __future__ import annotations

from .registry import SUITE_TEMPLATE

POOL_SHAPES = ({"B": 2, "K": 8}, {"B": 256, "K": 64}, {"B": 1024, "K": 128},
               {"B": 4096, "K": 64}, {"B": 4096, "K": 256})
RESIDUAL_SHAPES = ({"B": 3}, {"B": 4096}, {"B": 65536})
FRD_SHAPES = ({"B": 1024}, {"B": 16384}, {"B": 262144})
_HD = SUITE_TEMPLATE["N_HORIZONS"] * SUITE_TEMPLATE["HIDDEN_DIM"]
# reduce_axis0 as the backward passes call it: [B, H*D] scratch rows at the suite's batch sizes.
REDUCE_SHAPES = ({"N": 256, "M": _HD}, {"N": 4096, "M": _HD}, {"N": 65536, "M": _HD})

SUITE: dict[str, tuple[dict[str, int], ...]] = {
    "pool.forward": POOL_SHAPES,
    "pool.backward": POOL_SHAPES,
    "residual.forward": RESIDUAL_SHAPES,
    "residual.backward": RESIDUAL_SHAPES,
    "gate.forward": RESIDUAL_SHAPES,
    "gate.backward": RESIDUAL_SHAPES,
    "frd.softmax_ce_grad": FRD_SHAPES,
    "reduce_axis0": REDUCE_SHAPES,
}

# The original project's parity tests (exact shapes).
POOL_PARITY = {"B": 2, "K": 8, "HIDDEN_DIM": 128, "N_HORIZONS": 5}
RESIDUAL_PARITY = {"B": 3, "HIDDEN_DIM": 128, "N_HORIZONS": 5}
