"""PyTorch integration: the kernels as ``torch.library`` operators (``torch.ops.pycuda_heads``)
that ``torch.compile`` and CUDA graphs see as opaque nodes, and nn.Modules over them. The only
package of the runtime that imports torch.

Every launch goes on torch's current stream and every buffer comes from torch's caching
allocator, so torch's stream and CUDA-graph rules hold (``mode="reduce-overhead"``,
``torch.cuda.graph``). Tensors must be contiguous float32 CUDA tensors (int32 labels) on the
device of PyCUDA's primary context; anything else raises TypeError or ValueError naming the
argument before anything is launched.
"""
try:
    import torch  # noqa: F401
except ImportError:  # one line for the user, not a chain of import frames
    raise ImportError('pycuda_heads.torch needs PyTorch: pip install "pycuda-heads[torch]"') \
        from None

from .modules import AttentionPool, FrdHead, FrdLoss, ResidualGate
from .ops import (OPERATORS, adam_step, frd_loss, frd_softmax_ce, frdhead_forward,
                  frdhead_forward_loss, frdhead_loss, pool_forward, register, resgate_forward)

__all__ = ["AttentionPool", "FrdHead", "FrdLoss", "ResidualGate", "OPERATORS", "adam_step",
           "frd_loss", "frd_softmax_ce", "frdhead_forward", "frdhead_forward_loss",
           "frdhead_loss", "pool_forward", "register", "resgate_forward"]
