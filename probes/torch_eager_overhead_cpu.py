"""Where the host time of an eager pycuda_heads.torch call goes, on the CPU (torch's CPU build,
no GPU): a trivial autograd.Function against torch.add, and the operator's own path with its
launch program faked (checks, allocation and the Function, without the driver call). Prints JSON.

    python probes/torch_eager_overhead_cpu.py > probes/torch_eager_overhead_cpu.json
"""
import json
import platform
import timeit

import torch

from pycuda_heads.torch import launch, ops

N = 20000


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.empty(3)

    @staticmethod
    def backward(ctx, g):
        return g


class _NoLaunch:
    """A launch program that launches nothing: what is left is the Python around it."""
    outputs, scratch_bytes = [((2, 5, 128), None), ((2, 5, 8), None)], 0

    def run(self, *args):
        pass


def us(fn):
    return round(min(timeit.repeat(fn, number=N, repeat=5)) / N * 1e6, 2)


def main():
    x = torch.randn(3, requires_grad=True)
    q, ln = torch.randn(5, 128, requires_grad=True), torch.randn(2, 8, 128, requires_grad=True)
    method = launch.Method.__new__(launch.Method)
    method.names, method.programs, method.lib = ("q_h", "ln"), {}, None
    key = tuple((t.shape, t.dtype, t.get_device(), t.is_contiguous(), t.data_ptr() % 16)
                for t in (q, ln))
    method.programs[key] = (_NoLaunch(), torch.device("cpu"))
    launch.raw_stream = lambda index: 0
    op_id = len(ops._ops)
    ops._ops.append(None)
    ops._methods[(op_id, "pool_forward")] = method
    rule = ops._RULES["pool_forward"]
    out = {"what": " ".join(__doc__.split("\n\n")[0].split()),
           "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "us_per_call (fastest of 5 x 20000)": {
               "torch.add with grad": us(lambda: torch.add(x, x)),
               "torch.empty": us(lambda: torch.empty(3)),
               "trivial autograd.Function.apply": us(lambda: _Identity.apply(x)),
               "pool_forward's Method, launch faked": us(lambda: method(q, ln)),
               "pool_forward eager (Function + Method), launch faked":
                   us(lambda: ops._Eager.apply(rule, q, ln, op_id))}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
