"""FRD softmax + cross-entropy gradient over return atoms (cu/frd_softmax_ce_grad.cu).
Label -1 marks a horizon whose return is not realised yet: zero loss and zero gradient."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .arrays import as_device, check_aligned, empty
from .op import Op
from .space import KernelSpace


def shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    return 4 * (p["BLOCK"] // p["TPR"]) * env["N_ATOMS"] if p["LAYOUT"] == 1 and p["STAGE"] else 0


# LAYOUT 0 is the original block-per-row design (its other knobs are pinned to one value so it
# is one point of the space); LAYOUT 1 puts TPR lanes on a row and BLOCK/TPR rows in a block.
SPACE = KernelSpace(
    kernel="frd.softmax_ce_grad",
    params={"LAYOUT": (0, 1), "TPR": (1, 2, 4, 8, 16, 32), "BLOCK": (64, 128, 256, 512),
            "STAGE": (0, 1)},
    default={"LAYOUT": 0, "TPR": 1, "BLOCK": 64, "STAGE": 0},
    restrictions=("LAYOUT == 1 or (TPR == 1 and BLOCK == 64 and STAGE == 0)",
                  "LAYOUT == 1 or N_ATOMS <= 1024",
                  "(N_ATOMS + TPR - 1) // TPR <= 64",
                  "TPR < 2 * N_ATOMS"),
    launch_restrictions=("SHARED_BYTES <= MAX_SHARED_BYTES", "LAYOUT == 1 or N_HORIZONS <= 65535"),
    shared_bytes=shared_bytes,
)


class FrdSoftmaxCE(Op):
    """grad_logits, ce = frd.softmax_ce_grad(logits, labels)."""

    FAMILY = "frd_softmax_ce_grad"
    SPACES = {"softmax_ce_grad": SPACE}
    ENTRIES = {"softmax_ce_grad": ("frd_softmax_ce_grad", "PPPPif")}

    def __init__(self, n_horizons: int, n_atoms: int = 21,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons, "N_ATOMS": n_atoms}, launch)
        self.n_horizons, self.n_atoms = n_horizons, n_atoms

    def softmax_ce_grad(self, logits: Any, labels: Any, *,
                        check_labels: bool = True) -> tuple[Any, Any]:
        """grad_logits[B, H, A] = (softmax - onehot) / B and raw per-row ce[B, H].

        Labels are int32 in [-1, N_ATOMS). NumPy labels are always checked; device labels are
        checked with a device min/max (one synchronisation) unless ``check_labels=False``, in
        which case a bad label's row and loss come out NaN rather than plausible numbers.
        """
        dims = {"H": self.n_horizons, "A": self.n_atoms}
        logits = as_device(logits, "logits", ("B", "H", "A"), dims)
        host_labels = labels if isinstance(labels, np.ndarray) else None
        if host_labels is not None:
            self._check_labels(host_labels, dims)
        labels = as_device(labels, "labels", ("B", "H"), dims, dtype=np.int32)
        if host_labels is None and check_labels:
            self._check_device_labels(labels)
        b = dims["B"]
        rows = b * self.n_horizons
        params = self.launch_params("softmax_ce_grad", {"B": b})
        grad, ce = empty((b, self.n_horizons, self.n_atoms)), empty((b, self.n_horizons))
        args = (logits.gpudata, labels.gpudata, grad.gpudata, ce.gpudata, np.int32(rows),
                np.float32(1.0 / b))
        if params["LAYOUT"] == 1 and params["STAGE"]:
            check_aligned(4, logits=logits)  # the staged copy uses float4 loads
        kernel = self.kernel("softmax_ce_grad", params)
        if params["LAYOUT"] == 0:
            kernel((b, self.n_horizons, 1), (self.n_atoms, 1, 1), *args)
        else:
            rpb = params["BLOCK"] // params["TPR"]
            kernel((-(-rows // rpb), 1, 1), (params["BLOCK"], 1, 1), *args,
                   shared=shared_bytes(params, self.template))
        return grad, ce

    def _check_labels(self, labels: np.ndarray, dims: dict[str, int]) -> None:
        if labels.dtype != np.int32:
            raise TypeError(f"labels: expected dtype int32, got {labels.dtype}")
        bad = (labels < -1) | (labels >= self.n_atoms)
        if bad.any():
            pos = [int(i) for i in np.argwhere(bad)[0]]
            raise ValueError(f"labels{pos} = {int(labels[tuple(pos)])} is outside "
                             f"[-1, {self.n_atoms}) (-1 marks a horizon not realised yet)")

    def _check_device_labels(self, labels: Any) -> None:
        import pycuda.gpuarray as gpuarray
        lo, hi = int(gpuarray.min(labels).get()), int(gpuarray.max(labels).get())
        if lo < -1 or hi >= self.n_atoms:
            self._check_labels(labels.get(), {})
