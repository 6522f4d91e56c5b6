"""Running the kernels' PyTorch peers (each KernelSpec's ``peer``, the same math as its float64
reference) beside the library: torch set up to be timed on the same stream, eager or through
``torch.compile``, and the comparison of outputs. The only module of the bench importing torch.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..core.spec import KernelSpec


def prepare(device: str) -> None:
    """Set torch up to be timed beside the library on ``device``."""
    torch.set_float32_matmul_precision("highest")  # float32 like the library: no TF32
    if device == "cuda":
        torch.cuda.init()
        # The bench's events and spin kernel are on the legacy default stream; torch must
        # launch there too or the events would not bracket its kernels.
        handle = torch.cuda.current_stream().cuda_stream
        if handle != 0:
            raise RuntimeError(f"torch's current CUDA stream is {handle:#x}, not the legacy "
                               f"default stream the bench times on")


def reset() -> None:
    """Forget compiled graphs, so each shape compiles afresh under no recompile limit."""
    torch._dynamo.reset()


def _bind(peer: Callable[..., Any]) -> Callable[..., Any]:
    """``peer`` with torch as its first argument: a plain function torch.compile can trace."""
    def fn(*args: Any) -> Any:
        return peer(torch, *args)
    return fn


def call(spec: KernelSpec, x: Mapping[str, torch.Tensor], compiled: bool) -> Callable[[], Any]:
    """A call of ``spec``'s peer on its inputs from ``x`` (compiled per shape when asked)."""
    fn = _bind(spec.peer)
    if compiled:
        fn = torch.compile(fn, dynamic=False)
    return functools.partial(fn, *[x[n] for n in spec.reads])


def tf32_product(device: str) -> tuple[Callable[[], Any], int]:
    """A call of one float32 product on TF32 tensor cores (cuBLAS), square and large enough on
    a GPU to run at the device's rate, and its floating-point operations."""
    n = 8192 if device == "cuda" else 256
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)

    def product() -> None:
        # TF32 for this product only: the peers' own products stay float32
        before, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, True
        try:
            torch.mm(a, b, out=out)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    return product, 2 * n ** 3


def to_torch(x: Mapping[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(a).to(device) for name, a in x.items()}


def _as_tensor(arr: Any, device: torch.device) -> torch.Tensor:
    """A library output (a GPUArray, read in place through __cuda_array_interface__, or a
    host array) as a tensor on ``device``."""
    if isinstance(arr, torch.Tensor):
        return arr
    if hasattr(arr, "__cuda_array_interface__"):
        return torch.as_tensor(arr, device=device)
    return torch.as_tensor(np.asarray(arr), device=device)


def max_rel_err(library: Sequence[Any], peer: Sequence[torch.Tensor]) -> float:
    """Largest ||peer - library|| / ||library|| over the outputs of one call."""
    if len(library) != len(peer):
        raise ValueError(f"the library returned {len(library)} outputs, the peer {len(peer)}")
    worst = 0.0
    for lib, ref in zip(library, peer):
        got = _as_tensor(lib, ref.device).double()
        want = ref.double()
        if got.shape != want.shape:
            raise ValueError(f"output shapes differ: library {tuple(got.shape)}, "
                             f"peer {tuple(want.shape)}")
        scale = max(float(torch.linalg.vector_norm(got)), 1e-30)
        worst = max(worst, float(torch.linalg.vector_norm(want - got)) / scale)
    return worst
