"""Issue 32 probe: prototype FRD-head kernels (frdhead_mma.cu) against today's FrdHead.

One GPU call: compiles every prototype variant, draws inputs once per batch, runs today's
FrdHead + FrdSoftmaxCE and the prototypes at B = 1024, 16384, 65536 (D_in = F = 128, H = 5,
A = 21), checks each output against the float64 reference chain (and against today's kernels'
own error), poisons every output with NaN first, checks bitwise reruns, times every chain with
the library's CUDA-event timer (median of warm batches) and cuBLAS TF32 GEMMs of the same
shapes through torch as the yardstick. Prints a short table; writes everything to the JSON path.

    source .gpu/env.sh && python probes/frdhead_mma/run.py $OUT/frd_mma.json

``--check-only`` runs the B = 333 checks alone (for compute-sanitizer, which is slow):

    source .gpu/env.sh && compute-sanitizer --tool memcheck \
        python probes/frdhead_mma/run.py $OUT/frd_mma_check.json --check-only
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads.core.device import cuda, sm_count
from pycuda_heads.perf.timing import gpu_time_us

HERE = Path(__file__).resolve().parent
D, F, H, A = 128, 128, 5, 21
HA = H * A
TEMPLATE = {"D_IN": D, "FRD_HIDDEN": F, "N_HORIZONS": H, "N_ATOMS": A}
# the largest batch first: a run that reaches the time budget loses the others' timings first
BATCHES = (65536, 1024, 16384)
ODD_BATCH = 333  # checked, never timed: a last tile shorter than every BM
MAX_SMEM = 227 * 1024

# Forward variants: warps, rows per tile, warps down the rows in layer 1 and layer 2.
FWD = {"f8x64": dict(FWD_WARPS=8, FWD_BM=64, FWD_WM1=2, FWD_WM2=4),
       "f16x64": dict(FWD_WARPS=16, FWD_BM=64, FWD_WM1=2, FWD_WM2=4),
       "f16x64b": dict(FWD_WARPS=16, FWD_BM=64, FWD_WM1=4, FWD_WM2=4),
       "f8x32": dict(FWD_WARPS=8, FWD_BM=32, FWD_WM1=1, FWD_WM2=2),
       "f8x16": dict(FWD_WARPS=8, FWD_BM=16, FWD_WM1=1, FWD_WM2=1),
       "f4x16": dict(FWD_WARPS=4, FWD_BM=16, FWD_WM1=1, FWD_WM2=1)}
# Backward variants: warps, rows per tile, warps down M of the weight tile, down the out rows.
BWD = {"b8x32": dict(BWD_WARPS=8, BWD_BM=32, BWD_WMW=2, BWD_WMO=2),
       "b16x32": dict(BWD_WARPS=16, BWD_BM=32, BWD_WMW=4, BWD_WMO=2),
       "b16x64": dict(BWD_WARPS=16, BWD_BM=64, BWD_WMW=4, BWD_WMO=4),
       "b16x16": dict(BWD_WARPS=16, BWD_BM=16, BWD_WMW=4, BWD_WMO=1),
       "b8x16": dict(BWD_WARPS=8, BWD_BM=16, BWD_WMW=2, BWD_WMO=1)}
# Whole-step variants (forward + softmax-CE + both backward stages in one kernel): warps, rows
# per tile, warps down the rows of the row products, warps down M of the weight tiles.
STEP = {"s16x32": dict(STEP_WARPS=16, STEP_BM=32, STEP_WM=2, STEP_WMW=4),
        "s16x32b": dict(STEP_WARPS=16, STEP_BM=32, STEP_WM=1, STEP_WMW=4),
        "s8x32": dict(STEP_WARPS=8, STEP_BM=32, STEP_WM=2, STEP_WMW=2),
        "s8x16": dict(STEP_WARPS=8, STEP_BM=16, STEP_WM=1, STEP_WMW=2)}
S_PART = HA * F + HA + F * D + F
# (forward, grad_w2 stage, grad_w1 stage) chains run: the forward sweep beside one backward,
# the backward sweep beside one forward. b16x64's masked stage does not fit shared memory.
COMBOS = ([(f, "b16x32", "b16x32") for f in FWD]
          + [("f8x64", "b8x32", "b8x32"), ("f8x64", "b16x64", "b16x32"),
             ("f8x64", "b16x16", "b16x16"), ("f8x64", "b8x16", "b8x16")])
REPS = 15
# CUDA errors that leave the context unusable
STICKY = ("ILLEGAL", "LAUNCH_FAILED", "LAUNCH FAILED", "MISALIGNED", "UNSPECIFIED", "HARDWARE")
TIME_BUDGET_S = 130  # past this, variants are still checked but no longer timed


def up(n: int, m: int) -> int:
    return -(-n // m) * m


def fwd_smem(k: dict) -> int:
    """Bytes of FWD_SMEM_FLOATS in frdhead_mma.cu."""
    wn1, wn2 = k["FWD_WARPS"] // k["FWD_WM1"], k["FWD_WARPS"] // k["FWD_WM2"]
    k1, k2 = up(D, 8), up(F, 8)
    ext1, ext2 = up(F, 8 * wn1), up(HA, 8 * wn2)
    ldx, ldh = up(k1, 32) + 8, up(k2, 32) + 8
    tile = k["FWD_BM"] * max(ldx, ldh, HA)
    return 4 * (ext1 * ldx + ext2 * ldh + 2 * tile)


def bwd_dims(stage: int) -> tuple[int, int, bool]:
    return (HA, F, False) if stage == 2 else (F, D, True)


def bwd_smem(k: dict, stage: int) -> int:
    """Bytes of BWD_SMEM_FLOATS in frdhead_mma.cu."""
    sm, sn, masked = bwd_dims(stage)
    w, bm = k["BWD_WARPS"], k["BWD_BM"]
    wnw, wno = w // k["BWD_WMW"], w // k["BWD_WMO"]
    extm = -(-sm // (16 * k["BWD_WMW"])) * 16 * k["BWD_WMW"]
    extn = -(-sn // (8 * wnw)) * 8 * wnw
    exto = -(-sn // (8 * wno)) * 8 * wno
    lda, ldxn, ldw = up(extm, 32) + 4, up(extn, 32) + 4, up(exto, 32) + 4
    return 4 * (up(sm, 8) * ldw + 2 * bm * ((2 if masked else 1) * lda + ldxn))


def step_smem(k: dict) -> int:
    """Bytes of STEP_SMEM_FLOATS in frdhead_mma.cu."""
    w, bm, wm, wmw = k["STEP_WARPS"], k["STEP_BM"], k["STEP_WM"], k["STEP_WMW"]
    wn, wnw = w // wm, w // wmw
    cdiv = lambda n, m: -(-n // m)
    ldr, ldk = (lambda n: up(n, 32) + 8), (lambda n: up(n, 32) + 4)
    sk1, sk2, ska = up(D, 8), up(F, 8), up(HA, 8)
    ext1, ext2, extd = up(F, 8 * wn), up(HA, 8 * wn), up(D, 8 * wn)
    mtw2, ntw2 = cdiv(HA, 16 * wmw), cdiv(F, 8 * wnw)
    mtw1, ntw1 = cdiv(F, 16 * wmw), cdiv(D, 8 * wnw)
    ldw1, ldw2 = ldr(max(sk1, extd)), ldr(max(sk2, ext1))
    ldx, ldh = ldr(max(sk1, ntw1 * 8 * wnw)), ldr(max(sk2, ntw2 * 8 * wnw))
    ldg, ldd = ldk(max(ska, mtw2 * 16 * wmw)), ldk(max(sk2, mtw1 * 16 * wmw))
    return 4 * (max(ext1, sk2) * ldw1 + max(ext2, ska) * ldw2 + 2 * bm * ldx
                + bm * (ldh + ldg + ldd))


def sass_census(cubins: dict) -> dict:
    """HMMA / local-memory instruction counts per cubin from cuobjdump, where the machine has it:
    the products must be on the tensor cores and no array in local memory."""
    import re
    import shutil
    import subprocess
    import tempfile
    if not shutil.which("cuobjdump"):
        return {"error": "no cuobjdump"}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, cubin in cubins.items():
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
            sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True,
                                  text=True).stdout
            name = "/".join(map(str, key if isinstance(key, tuple) else (key,)))
            out[name] = {op: len(re.findall(rf"\b{op}\b", sass))
                         for op in ("HMMA", "HGMMA", "LDL", "STL", "BAR", "LDS", "LDGSTS")}
    return out


class Kernels:
    """Compiled prototype entries, prepared for cheap launches."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor
        from pycuda.compiler import compile as nvcc_compile
        import pycuda.driver as drv
        self.drv = drv
        src = (HERE / "frdhead_mma.cu").read_text()
        jobs = {}
        for name, k in FWD.items():
            for fused in (0, 1):
                jobs["fwd", name, fused] = ("frdmma_forward", {**k, "FUSED": fused},
                                            "PPPPPPPPPiif", fwd_smem(k))
        for name, k in BWD.items():
            for stage in (2, 1):
                if bwd_smem(k, stage) <= MAX_SMEM:
                    jobs["bwd", name, stage] = ("frdmma_backward", {**k, "STAGE": stage},
                                                "PPPPPPii", bwd_smem(k, stage))
        for name, k in STEP.items():
            if step_smem(k) <= MAX_SMEM:
                jobs["step", name, 0] = ("frdmma_step", k, "PPPPPPPPPiif", step_smem(k))
        jobs["reduce"] = ("frdmma_reduce", {"REDUCE": 1}, "PPii", 0)
        t0 = time.perf_counter()
        # worker threads have no current context: the target is named here
        arch = "sm_%d%d" % drv.Context.get_device().compute_capability()

        def build(knobs: dict) -> bytes:  # nvcc runs in a subprocess: threads overlap
            opts = [f"-D{k}={v}" for k, v in {**TEMPLATE, **knobs}.items()]
            return nvcc_compile(src, options=opts, no_extern_c=True, arch=arch,
                                include_dirs=[str(HERE)])  # ../tf32_mma.cuh

        with ThreadPoolExecutor(8) as pool:
            cubins = dict(zip(jobs, pool.map(lambda j: build(j[1]), jobs.values())))
        self.compile_s = time.perf_counter() - t0
        self.sass = sass_census(cubins)
        self.fwd, self.bwd, self.step, self.info = {}, {}, {}, {}
        for key, (entry, knobs, types, smem) in jobs.items():
            fn = drv.module_from_buffer(cubins[key]).get_function(entry)
            if smem > 48 * 1024:
                fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            fn.prepare(types)
            threads = 32 * knobs.get("FWD_WARPS", knobs.get("BWD_WARPS",
                                                             knobs.get("STEP_WARPS", 8)))
            self.info["/".join(map(str, key if isinstance(key, tuple) else (key,)))] = {
                "regs": fn.num_regs, "local_bytes": fn.local_size_bytes, "smem": smem}
            handle = (fn, smem, threads)
            if key == "reduce":
                self.reduce = handle
            elif key[0] == "fwd":
                self.fwd[key[1], key[2]] = handle
            elif key[0] == "step":
                self.step[key[1]] = handle
            else:
                self.bwd[key[1], key[2]] = handle


def chunk_for(b: int, bm: int, n_sm: int, scale: int = 1) -> int:
    """Rows per block: one wave of blocks (about one per SM), a multiple of the tile."""
    return up(-(-b // (n_sm * scale)), bm)


class Proto:
    """One prototype chain at one batch: outputs allocated once."""

    def __init__(self, ks: Kernels, x: dict, b: int, fwd: str, bwd2: str, bwd1: str,
                 fused: int, n_sm: int, gpuarray):
        self.ks, self.x, self.b, self.fused = ks, x, b, fused
        self.ga = gpuarray
        self.f, self.fsm, self.ft = ks.fwd[fwd, fused]
        self.f_chunk = chunk_for(b, FWD[fwd]["FWD_BM"], n_sm)
        self.s2, self.s2sm, self.s2t = ks.bwd[bwd2, 2]
        self.s1, self.s1sm, self.s1t = ks.bwd[bwd1, 1]
        self.c2 = chunk_for(b, BWD[bwd2]["BWD_BM"], n_sm)
        self.c1 = chunk_for(b, BWD[bwd1]["BWD_BM"], n_sm)
        self.n2, self.n1 = -(-b // self.c2), -(-b // self.c1)
        e = lambda *s: gpuarray.empty(s, np.float32)
        self.out = {"hidden": e(b, F), "out": e(b, HA), "ce": e(b, H), "dhidden": e(b, F),
                    "scratch2": e(self.n2, HA * F + HA), "scratch1": e(self.n1, F * D + F),
                    "red2": e(HA * F + HA), "red1": e(F * D + F), "grad_h_t": e(b, D)}
        self.grid_f = (-(-b // self.f_chunk), 1, 1)

    def forward(self, stream=None):
        x, o = self.x, self.out
        self.f.prepared_async_call(
            self.grid_f, (self.ft, 1, 1), stream, x["h_t"].gpudata,
            x["w1"].gpudata, x["b1"].gpudata, x["w2"].gpudata, x["b2"].gpudata,
            x["labels"].gpudata, o["hidden"].gpudata, o["out"].gpudata, o["ce"].gpudata,
            np.int32(self.b), np.int32(self.f_chunk), np.float32(1.0 / self.b),
            shared_size=self.fsm)

    def backward(self, grad_logits, stream=None):
        x, o, ks = self.x, self.out, self.ks
        self.s2.prepared_async_call(
            (self.n2, 1, 1), (self.s2t, 1, 1), stream, grad_logits.gpudata,
            o["hidden"].gpudata, x["w2"].gpudata, np.intp(0), o["scratch2"].gpudata,
            o["dhidden"].gpudata, np.int32(self.b), np.int32(self.c2), shared_size=self.s2sm)
        self._reduce(o["scratch2"], o["red2"], self.n2, HA * F + HA, stream)
        self.s1.prepared_async_call(
            (self.n1, 1, 1), (self.s1t, 1, 1), stream, o["dhidden"].gpudata,
            x["h_t"].gpudata, x["w1"].gpudata, o["hidden"].gpudata, o["scratch1"].gpudata,
            o["grad_h_t"].gpudata, np.int32(self.b), np.int32(self.c1), shared_size=self.s1sm)
        self._reduce(o["scratch1"], o["red1"], self.n1, F * D + F, stream)

    def step(self, grad_logits=None):
        """Fused: forward (grad_logits inside) + backward; unfused: head fwd+bwd on the given
        grad_logits (the bench's FrdHead fwd+bwd)."""
        self.forward()
        self.backward(self.out["out"] if self.fused else grad_logits)

    def _reduce(self, src, dst, n, m, stream):
        fn = self.ks.reduce[0]
        fn.prepared_async_call((-(-m // 32), 1, 1), (256, 1, 1), stream, src.gpudata,
                               dst.gpudata, np.int32(n), np.int32(m))

    def poison(self):
        for a in self.out.values():
            a.fill(np.float32(np.nan))

    def results(self) -> dict:
        o = {k: v.get() for k, v in self.out.items()}
        res = {"hidden": o["hidden"], "grad_w2": o["red2"][: HA * F].reshape(HA, F),
               "grad_b2": o["red2"][HA * F:], "dhidden": o["dhidden"],
               "grad_w1": o["red1"][: F * D].reshape(F, D), "grad_b1": o["red1"][F * D:],
               "grad_h_t": o["grad_h_t"]}
        if self.fused:
            res["grad_logits"], res["ce"] = o["out"], o["ce"]
        else:
            res["logits"] = o["out"]
        return res


class StepProto:
    """The whole-step kernel and its one reduce at one batch: outputs allocated once."""

    fused = 1

    def __init__(self, ks: Kernels, x: dict, b: int, name: str, n_sm: int, gpuarray):
        self.ks, self.x, self.b = ks, x, b
        self.fn, self.smem, self.threads = ks.step[name]
        self.chunk = chunk_for(b, STEP[name]["STEP_BM"], n_sm)
        self.n = -(-b // self.chunk)
        e = lambda *s: gpuarray.empty(s, np.float32)
        self.out = {"scratch": e(self.n, S_PART), "red": e(S_PART), "grad_h_t": e(b, D),
                    "ce": e(b, H)}

    def step(self, grad_logits=None):
        x, o = self.x, self.out
        self.fn.prepared_async_call(
            (self.n, 1, 1), (self.threads, 1, 1), None, x["h_t"].gpudata, x["w1"].gpudata,
            x["b1"].gpudata, x["w2"].gpudata, x["b2"].gpudata, x["labels"].gpudata,
            o["scratch"].gpudata, o["grad_h_t"].gpudata, o["ce"].gpudata, np.int32(self.b),
            np.int32(self.chunk), np.float32(1.0 / self.b), shared_size=self.smem)
        fn = self.ks.reduce[0]
        fn.prepared_async_call((-(-S_PART // 32), 1, 1), (256, 1, 1), None,
                               o["scratch"].gpudata, o["red"].gpudata, np.int32(self.n),
                               np.int32(S_PART))

    def poison(self):
        for a in self.out.values():
            a.fill(np.float32(np.nan))

    def results(self) -> dict:
        o = {k: v.get() for k, v in self.out.items()}
        r, i = o["red"], HA * F
        return {"grad_w2": r[:i].reshape(HA, F), "grad_b2": r[i:i + HA],
                "grad_w1": r[i + HA:i + HA + F * D].reshape(F, D), "grad_b1": r[i + HA + F * D:],
                "grad_h_t": o["grad_h_t"], "ce": o["ce"]}


def rel(out: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want, np.float64).reshape(-1)
    out = np.asarray(out, np.float64).reshape(-1)
    return float(np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-300))


def draw(rng: np.random.Generator, b: int) -> dict:
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    labels = rng.integers(0, A, size=(b, H)).astype(np.int32)
    labels[rng.random((b, H)) < 0.1] = -1
    labels[-3:] = -1  # rows whose every horizon is the sentinel
    return {"h_t": rng.standard_normal((b, D), dtype=np.float32), "w1": w(F, D),
            "b1": (0.1 * rng.standard_normal(F)).astype(np.float32), "w2": w(HA, F),
            "b2": (0.1 * rng.standard_normal(HA)).astype(np.float32), "labels": labels}


def reference_chain(x: dict) -> dict:
    hidden, logits = ref.frdhead_forward(x["h_t"], x["w1"], x["b1"], x["w2"].reshape(H, A, F),
                                         x["b2"].reshape(H, A))
    g, ce = ref.frd_softmax_ce_grad(logits, x["labels"])
    gw2, gb2, dh = ref.frdhead_grad_w2(hidden, x["w2"].reshape(H, A, F), g)
    gw1, gb1, ght = ref.frdhead_grad_w1(x["h_t"], x["w1"], hidden, dh)
    return {"hidden": hidden, "logits": logits, "grad_logits": g, "ce": ce,
            "grad_w2": gw2.reshape(HA, F), "grad_b2": gb2.reshape(-1), "dhidden": dh,
            "grad_w1": gw1, "grad_b1": gb1, "grad_h_t": ght}


class Library:
    """Today's kernels: FrdHead forward, FrdSoftmaxCE, grad_w2, grad_w1."""

    def __init__(self, dx: dict):
        self.head, self.frd, self.x = ph.FrdHead(D, F, H, A), ph.FrdSoftmaxCE(H, A), dx
        self.w2v = dx["w2"].reshape(H, A, F)
        self.b2v = dx["b2"].reshape(H, A)

    def head_step(self, grad_logits):
        x = self.x
        hidden, _ = self.head.forward(x["h_t"], x["w1"], x["b1"], self.w2v, self.b2v)
        _, _, dh = self.head.grad_w2(hidden, self.w2v, grad_logits)
        self.head.grad_w1(x["h_t"], x["w1"], hidden, dh)

    def loss_step(self):
        x = self.x
        hidden, logits = self.head.forward(x["h_t"], x["w1"], x["b1"], self.w2v, self.b2v)
        g, _ = self.frd.softmax_ce_grad(logits, x["labels"], check_labels=False)
        _, _, dh = self.head.grad_w2(hidden, self.w2v, g)
        self.head.grad_w1(x["h_t"], x["w1"], hidden, dh)

    def results(self) -> dict:
        x = self.x
        hidden, logits = self.head.forward(x["h_t"], x["w1"], x["b1"], self.w2v, self.b2v)
        g, ce = self.frd.softmax_ce_grad(logits, x["labels"], check_labels=False)
        gw2, gb2, dh = self.head.grad_w2(hidden, self.w2v, g)
        gw1, gb1, ght = self.head.grad_w1(x["h_t"], x["w1"], hidden, dh)
        out = {"hidden": hidden, "logits": logits, "grad_logits": g, "ce": ce, "grad_w2": gw2,
               "grad_b2": gb2, "dhidden": dh, "grad_w1": gw1, "grad_b1": gb1, "grad_h_t": ght}
        return {k: v.get().reshape(-1) for k, v in out.items()}


def torch_yardstick(x: dict, b: int) -> dict:
    """cuBLAS TF32 GEMMs of the head's six products, and torch eager fp32 head + CE fwd+bwd."""
    try:
        import torch
        import torch.nn.functional as Fn
    except ImportError as e:
        return {"error": repr(e)}
    dev = "cuda"
    t = {k: torch.from_numpy(v).to(dev) for k, v in x.items()}
    g = torch.randn(b, HA, device=dev) / b
    hid = torch.relu(t["h_t"] @ t["w1"].T)

    def gemms():
        h = t["h_t"] @ t["w1"].T
        lg = hid @ t["w2"].T
        gw2 = g.T @ hid
        dh = g @ t["w2"]
        gw1 = hid.T @ t["h_t"]
        gh = hid @ t["w1"]
        return h, lg, gw2, dh, gw1, gh

    labels = t["labels"].long().reshape(-1)
    p = {k: t[k].clone().requires_grad_(True) for k in ("w1", "b1", "w2", "b2")}
    hx = t["h_t"].clone().requires_grad_(True)

    def eager():
        hidden = torch.relu(hx @ p["w1"].T + p["b1"])
        logits = hidden @ p["w2"].T + p["b2"]
        loss = Fn.cross_entropy(logits.reshape(-1, A), labels, ignore_index=-1,
                                reduction="sum") / b
        torch.autograd.grad(loss, [hx, *p.values()])

    out = {}
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        out["cublas_tf32_six_gemms_us"] = gpu_time_us(gemms, reps=15)["median_us"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    out["cublas_fp32_six_gemms_us"] = gpu_time_us(gemms, reps=15)["median_us"]
    out["torch_eager_head_ce_fwd_bwd_us"] = gpu_time_us(eager, reps=15)["median_us"]
    torch.cuda.synchronize()
    return out


def floors(b: int) -> dict:
    """Predicted floors: 3xTF32 compute at ~165 TFLOP/s (a third of dense TF32), the bytes the
    fused chain must move at 4.3 TB/s (h_t in twice, hidden out and in twice, grad_logits out and
    in, dhidden out and in, grad_h_t out), and a single fused-kernel floor (h_t in, grad_h_t
    out)."""
    flop = 2 * b * (D * F + F * HA) + 2 * b * (2 * HA * F + 2 * F * D)
    chain = 4 * b * (2 * D + 3 * F + 2 * HA + 2 * F + D + H + H)
    single = 4 * b * (2 * D + 2 * H)
    return {"gflop": flop / 1e9, "compute_3xtf32_us": flop / 165e12 * 1e6,
            "chain_bytes_mb": chain / 1e6, "chain_mem_us": chain / 4.3e12 * 1e6,
            "single_kernel_mem_us": single / 4.3e12 * 1e6}


def main(path: str, check_only: bool = False) -> None:
    t_start = time.perf_counter()
    drv = cuda()
    import pycuda.gpuarray as gpuarray
    n_sm = sm_count()
    ks = Kernels()
    report = {"n_sm": n_sm, "compile_s": ks.compile_s, "kernels": ks.info, "sass": ks.sass,
              "batches": {}}
    local = {k: v for k, v in ks.sass.items() if isinstance(v, dict) and v["LDL"] + v["STL"]}
    print(f"compiled {len(ks.info)} kernels in {ks.compile_s:.0f} s; regs "
          + " ".join(f"{k.split(':')[0]}={v['regs']}" for k, v in ks.info.items())
          + f"; local-memory SASS in {sorted(local) or 'none'}")
    rng = np.random.default_rng(32)
    fatal = None  # a sticky CUDA error (a faulting kernel) ends all GPU work; the JSON still lands
    for b in (ODD_BATCH, *(() if check_only else BATCHES)):
        if fatal:
            break
        timing = b != ODD_BATCH
        x = draw(rng, b)
        dx = {k: gpuarray.to_gpu(v) for k, v in x.items()}
        want = reference_chain(x)
        lib = Library(dx)
        lib_res = lib.results()
        lib_err = {k: rel(v, want[k]) for k, v in lib_res.items()}
        lib_again = lib.results()
        lib_bitwise = all(lib_res[k].tobytes() == lib_again[k].tobytes() for k in lib_res)
        g_lib = gpuarray.to_gpu(lib_res["grad_logits"].reshape(b, H, A))  # the unfused chains' G
        row = {"floors": floors(b), "library": {"err": lib_err, "bitwise": lib_bitwise}}
        if timing:
            row["library"]["head_fwd_bwd_us"] = gpu_time_us(
                lambda: lib.head_step(g_lib))["median_us"]
            row["library"]["head_loss_fwd_bwd_us"] = gpu_time_us(lib.loss_step)["median_us"]
        protos = {}
        cands = [(f"{fn}+{b2}/{b1}+{'fused' if fu else 'head'}",
                  lambda fn=fn, b2=b2, b1=b1, fu=fu:
                  Proto(ks, dx, b, fn, b2, b1, fu, n_sm, gpuarray))
                 for fn, b2, b1 in COMBOS for fu in (1, 0)]
        cands += [(f"{sn}+step", lambda sn=sn: StepProto(ks, dx, b, sn, n_sm, gpuarray))
                  for sn in ks.step]
        for name, make in cands:
            rec = {}
            try:
                pr = make()
                rec["chunks"] = ([pr.f_chunk, pr.c2, pr.c1] if isinstance(pr, Proto)
                                 else [pr.chunk])
                pr.poison()
                pr.step(g_lib)
                res = pr.results()
                rec["all_written"] = bool(all(np.isfinite(v).all() for v in res.values()))
                rec["err"] = {k: rel(v, want[k]) for k, v in res.items()}
                # error over today's kernel's error on the same output (>> 1: a failure)
                rec["err_ratio_max"] = max(rec["err"][k] / max(lib_err[k], 1e-12)
                                           for k in rec["err"])
                pr.poison()
                pr.step(g_lib)
                again = pr.results()
                rec["bitwise"] = all(res[k].tobytes() == again[k].tobytes() for k in res)
                if not timing:
                    pass
                elif time.perf_counter() - t_start > TIME_BUDGET_S:
                    rec["skipped_timing"] = True
                else:
                    rec["us"] = gpu_time_us(lambda: pr.step(g_lib), reps=REPS)["median_us"]
                    if isinstance(pr, Proto):
                        rec["fwd_us"] = gpu_time_us(pr.forward, reps=REPS)["median_us"]
                        gl = pr.out["out"] if pr.fused else g_lib
                        rec["bwd_us"] = gpu_time_us(lambda: pr.backward(gl),
                                                    reps=REPS)["median_us"]
            except Exception as e:  # one variant's failure must not end the run
                rec["error"] = repr(e)[:300]
                if any(w in rec["error"].upper() for w in STICKY):
                    fatal = f"{name} at B={b}: {rec['error']}"
            protos[name] = rec
            if fatal:
                break
        row["protos"] = protos
        row["torch"] = torch_yardstick(x, b) if timing and not fatal else {}
        (report["batches"] if timing else report.setdefault("odd", {}))[b] = row
        write(path, report, t_start)
        del dx, lib, g_lib
    report["fatal"] = fatal
    write(path, report, t_start)
    summarize(report)


def write(path: str, report: dict, t_start: float) -> None:
    """The report so far: a run cut short still leaves what it measured."""
    report["wall_s"] = time.perf_counter() - t_start
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1, default=float))


def summarize(report: dict) -> None:
    """Per batch: today's times, the floors, the six fastest prototypes, every failed check."""
    for b, row in report.get("odd", {}).items():
        bad = {n: r.get("error", "") or {k: r.get(k) for k in ("all_written", "bitwise",
                                                             "err_ratio_max")}
               for n, r in row["protos"].items() if "error" in r or not (
                   r.get("all_written") and r.get("bitwise") and r.get("err_ratio_max", 99) < 4)}
        print(f"B={b} (tails, checked only): {len(row['protos']) - len(bad)} of "
              f"{len(row['protos'])} prototypes pass" + (f"; failing: {bad}" if bad else ""))
    if report.get("fatal"):
        print(f"FATAL: {report['fatal']}")
    for b, row in report["batches"].items():
        lib = row["library"]
        fl, tr = row["floors"], row["torch"]
        print(f"B={b}: library head {lib['head_fwd_bwd_us']:.1f} us, head+loss "
              f"{lib['head_loss_fwd_bwd_us']:.1f} us (bitwise {lib['bitwise']}); floors 3xTF32 "
              f"{fl['compute_3xtf32_us']:.1f}, chain mem {fl['chain_mem_us']:.1f}, one-kernel mem "
              f"{fl['single_kernel_mem_us']:.1f} us; torch "
              + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in tr.items()))
        timed = sorted(((n, r) for n, r in row["protos"].items() if "us" in r),
                       key=lambda nr: nr[1]["us"])
        bad = [(n, r) for n, r in row["protos"].items() if "error" in r or not (
            r.get("all_written") and r.get("bitwise") and r.get("err_ratio_max", 99) < 4)]
        shown = timed[:6] + [nr for nr in bad if nr not in timed[:6]]
        for n, r in shown:
            if "error" in r:
                print(f"  {n:34s} ERROR {r['error'][:150]}")
                continue
            us = f"{r['us']:7.1f} us" if "us" in r else "  untimed "
            parts = (f"(fwd {r['fwd_us']:6.1f}, bwd {r['bwd_us']:6.1f})" if "fwd_us" in r
                     else " " * 26)
            print(f"  {n:34s} {us} {parts}  err/lib {r['err_ratio_max']:5.2f}"
                  f"  written {r['all_written']}  bitwise {r['bitwise']}")
        for kind, base in (("+head", lib["head_fwd_bwd_us"]),
                           ("+fused", lib["head_loss_fwd_bwd_us"]),
                           ("+step", lib["head_loss_fwd_bwd_us"])):
            best = [(n, r) for n, r in timed if n.endswith(kind) and (n, r) not in bad]
            if best:
                print(f"  best {kind[1:]:5s}: {best[0][0]} {best[0][1]['us']:.1f} us = "
                      f"{best[0][1]['us'] / base:.2f}x today's")
    print(f"wall {report['wall_s']:.0f} s")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--check-only"]
    main(args[0] if args else "frd_mma.json", "--check-only" in sys.argv)
