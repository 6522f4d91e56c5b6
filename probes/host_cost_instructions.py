"""Machine instructions per op call with PyCUDA faked, counted by valgrind (callgrind): a
noise-free A/B of the library's own Python between two checkouts. Each run makes ``N`` calls of
every case of ``host_cost_ab.py`` (or only case ``$2``: 0-3) after one warm call; the
difference between N and 0 over N is the instructions of one call of each case, summed.

    for n in 0 3000; do PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python probes/host_cost_instructions.py $n; done   # "Collected" lines, per checkout
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_cost_ab  # noqa: E402  (the fake PyCUDA and the cases)


def main(n: int, only: str = "") -> None:
    os.environ["PYCUDA_HEADS_SYNC"] = "0"
    host_cost_ab.fake()
    import numpy as np
    import pycuda_heads as ph
    h, d = 5, 128
    gpu = lambda *s: host_cost_ab.FakeGPUArray(s, np.float32, gpudata=1 << 30)  # noqa: E731
    rg, pool = ph.ResidualGate(h, d), ph.PerHorizonAttentionPool(h, d)
    x = (gpu(3, h, d), gpu(h, d), gpu(h), gpu(3, h), gpu(h))
    q, ln, attn, g = gpu(h, d), gpu(2, 8, d), gpu(2, h, 8), gpu(2, h, d)
    cases = [lambda: rg.forward(*x), lambda: rg.backward(x[0], x[1], x[4], x[3], x[3]),
             lambda: pool.forward(q, ln), lambda: pool.backward(q, ln, attn, g)]
    for case in cases:
        case()
    for i, case in enumerate(cases):
        for _ in range(n if not only or str(i) == only else 0):
            case()


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:3])
