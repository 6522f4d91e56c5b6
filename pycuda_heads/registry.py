"""Every tunable kernel: its name, the op class and role that launch it, its search space and
the template constants of the suite. The static check, tuner and reports iterate over this."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .alpha_gate import AlphaGate
from .attention_pool import PerHorizonAttentionPool
from .frd import FrdSoftmaxCE
from .op import Op
from .reduce import ReduceAxis0
from .residual import PerHorizonResidual
from .space import KernelSpace

# DESIGN.md section 6: the constants every suite shape uses.
SUITE_TEMPLATE = {"N_HORIZONS": 5, "HIDDEN_DIM": 128, "N_ATOMS": 21}


@dataclass(frozen=True)
class KernelInfo:
    name: str
    op: type[Op]
    role: str
    template_keys: tuple[str, ...]

    @property
    def space(self) -> KernelSpace:
        return self.op.SPACES[self.role]

    @property
    def family(self) -> str:
        return self.op.FAMILY

    def template(self, constants: dict[str, Any] | None = None) -> dict[str, int]:
        constants = constants or SUITE_TEMPLATE
        return {k: int(constants[k]) for k in self.template_keys}


_HD = ("N_HORIZONS", "HIDDEN_DIM")
KERNELS: dict[str, KernelInfo] = {k.name: k for k in (
    KernelInfo("pool.forward", PerHorizonAttentionPool, "forward", _HD),
    KernelInfo("pool.backward", PerHorizonAttentionPool, "backward", _HD),
    KernelInfo("residual.forward", PerHorizonResidual, "forward", _HD),
    KernelInfo("residual.backward", PerHorizonResidual, "backward", _HD),
    KernelInfo("gate.forward", AlphaGate, "forward", ("N_HORIZONS",)),
    KernelInfo("gate.backward", AlphaGate, "backward", ("N_HORIZONS",)),
    KernelInfo("frd.softmax_ce_grad", FrdSoftmaxCE, "softmax_ce_grad", ("N_HORIZONS", "N_ATOMS")),
    KernelInfo("reduce_axis0", ReduceAxis0, "reduce", ()),
)}


def static_check(info: KernelInfo, params: dict[str, Any], arch: str = "sm_90",
                 template: dict[str, Any] | None = None) -> Any:
    """The static report of one point of ``info``'s space (its own entry's resources)."""
    from .static_check import check_variant
    return check_variant(info.family, {**info.template(template), **params}, arch,
                         entry=info.op.ENTRIES[info.role][0])
