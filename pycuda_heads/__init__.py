"""pycuda-heads: deterministic fused CUDA kernels for multi-horizon prediction heads.

Importing needs no GPU (PyCUDA is imported when the first op is constructed):

    import pycuda_heads as ph
    pool = ph.PerHorizonAttentionPool(n_horizons=5, hidden_dim=128)
    ctx, attn = pool.forward(q_h, ln)
"""
from .core.compile import LaunchError
from .core.deferred import synchronize
from .core.device import GpuUnavailableError, gpu_available
from .ops.adam import Adam
from .ops.frd import FrdSoftmaxCE
from .ops.frdhead import FrdHead
from .ops.frdsmall import FrdHeadSmall
from .ops.gate import AlphaGate
from .ops.headloss import HeadLoss
from .ops.multiadam import AdamSchedule, MultiAdam
from .ops.pool import PerHorizonAttentionPool
from .ops.reduce import ReduceAxis0, reduce_axis0
from .ops.residual import PerHorizonResidual
from .ops.resgate import ResidualGate
from .records import VERSION
from .step import HeadStep, TrainStep

__version__ = VERSION
__all__ = ["Adam", "AdamSchedule", "AlphaGate", "FrdHead", "FrdHeadSmall", "FrdSoftmaxCE",
           "GpuUnavailableError", "HeadLoss", "HeadStep", "LaunchError", "MultiAdam",
           "PerHorizonAttentionPool", "PerHorizonResidual", "ReduceAxis0", "ResidualGate",
           "TrainStep", "gpu_available", "reduce_axis0", "synchronize", "__version__"]
