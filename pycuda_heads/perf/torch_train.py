"""The ``torch_train`` rows of the bench: a PyTorch user's training step (forward, loss,
backward, ``torch.optim.Adam(fused=True)``) as wall time per step, host and GPU together.

Two models, each written twice: with the library's modules (``pycuda_heads.torch``) and in
plain torch ops (the kernels' declared torch peers where they exist, ``cross_entropy`` and
``mse_loss`` for the losses):
- ``frd``: the FRD MLP head + FRD loss, h_t [B, D_IN] -> logits [B, H, A], labels with -1;
- ``pool``: attention pool + residual/gate + MSE, ln [B, K, D] and head [B, H] (both leaves,
  as an encoder's and the existing head's outputs are).

Providers, all in one run: each model eager, under ``torch.compile`` and under
``torch.compile(mode="reduce-overhead")`` (CUDA graph trees)."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from ..catalog import SUITE_TEMPLATE, catalog
from ..records import FWD_BWD, TORCH_TRAIN_OP, dims_label
from .step_bench import error, wall_us

MODELS = ("frd", "pool")
SHAPES = {"frd": ({"B": 256}, {"B": 4096}, {"B": 65536}),
          "pool": ({"B": 2, "K": 8}, {"B": 256, "K": 64}, {"B": 4096, "K": 256})}
MODES = {"eager": None, "compile": "default", "compile_ro": "reduce-overhead"}
#: provider -> (which implementation, how it runs)
PROVIDERS = {f"{impl}_{mode}": (impl, mode) for impl in ("library", "torch") for mode in MODES}
#: the fused Adam step alone over the model's parameters, gradients in place: the part of every
#: provider's step that no kernel of the library changes
ADAM_ONLY = "adam_only"
D_IN, FRD_HIDDEN = 128, 128
N_HORIZONS, HIDDEN_DIM, N_ATOMS = (SUITE_TEMPLATE["N_HORIZONS"], SUITE_TEMPLATE["HIDDEN_DIM"],
                                   21)


def _twin(torch: Any, module: Any) -> dict[str, Any]:
    """The plain-torch model's parameters: copies of the library module's."""
    return {n: torch.nn.Parameter(p.detach().clone()) for n, p in module.named_parameters()}


def frd_models(torch: Any, device: str = "cuda",
               seed: int = 0) -> tuple[Callable, Callable, list, list]:
    """(library loss(h_t, labels), torch loss(h_t, labels), their parameters)."""
    from ..torch import FrdHead, FrdLoss
    torch.manual_seed(seed)
    head = FrdHead(D_IN, FRD_HIDDEN, N_HORIZONS, N_ATOMS, device=device)
    loss = FrdLoss(N_HORIZONS, N_ATOMS)
    plain = _twin(torch, head)
    peer = catalog()["frdhead.forward"].peer
    ce = torch.nn.functional.cross_entropy

    def library(h_t: Any, labels: Any) -> Any:
        return loss(head(h_t), labels)

    def torch_model(h_t: Any, labels: Any) -> Any:
        _, logits = peer(torch, h_t, *(plain[n] for n in ("w1", "b1", "w2", "b2")))
        return ce(logits.reshape(-1, N_ATOMS), labels.reshape(-1).long(), ignore_index=-1,
                  reduction="sum") / h_t.shape[0]
    return library, torch_model, list(head.parameters()), list(plain.values())


def pool_models(torch: Any, device: str = "cuda",
                seed: int = 0) -> tuple[Callable, Callable, list, list]:
    """(library loss(ln, head, target), torch loss(ln, head, target), their parameters)."""
    from ..torch import AttentionPool, ResidualGate
    torch.manual_seed(seed)
    pool = AttentionPool(N_HORIZONS, HIDDEN_DIM, device=device)
    gate = ResidualGate(N_HORIZONS, HIDDEN_DIM, device=device)
    with torch.no_grad():  # an open gate: every path of the backward carries gradient
        gate.alpha.uniform_(-1, 1)
    plain = {**_twin(torch, pool), **_twin(torch, gate)}
    specs = catalog()
    pool_peer, gate_peer = specs["pool.forward"].peer, specs["resgate.forward"].peer
    mse = torch.nn.functional.mse_loss

    def library(ln: Any, head: Any, target: Any) -> Any:
        ctx, _ = pool(ln)
        return mse(gate(ctx, head), target)

    def torch_model(ln: Any, head: Any, target: Any) -> Any:
        ctx, _ = pool_peer(torch, plain["q_h"], ln)
        out, _ = gate_peer(torch, ctx, plain["w_res"], plain["bias_res"], head, plain["alpha"])
        return mse(out, target)
    return (library, torch_model, [*pool.parameters(), *gate.parameters()],
            list(plain.values()))


def batch(torch: Any, model: str, shape: Mapping[str, int], device: str = "cuda",
          seed: int = 1) -> list[Any]:
    """The step's inputs (leaves where a gradient reaches them)."""
    g = torch.Generator(device=device).manual_seed(seed)
    b = shape["B"]
    if model == "frd":
        h_t = torch.randn(b, D_IN, device=device, generator=g)
        labels = torch.randint(-1, N_ATOMS, (b, N_HORIZONS), device=device, generator=g,
                               dtype=torch.int32)
        return [h_t, labels]
    ln = torch.randn(b, shape["K"], HIDDEN_DIM, device=device, generator=g)
    head = torch.randn(b, N_HORIZONS, device=device, generator=g)
    target = torch.randn(b, N_HORIZONS, device=device, generator=g)
    return [ln.requires_grad_(True), head.requires_grad_(True), target]


def models(torch: Any, model: str, device: str = "cuda") -> tuple[Callable, Callable, list,
                                                                   list]:
    """(library loss, plain-torch loss, their parameters) of ``model``."""
    return (frd_models if model == "frd" else pool_models)(torch, device)


def train_step(torch: Any, loss_fn: Callable, params: list, inputs: list,
               mode: str | None) -> Callable[[], None]:
    """One training step of ``loss_fn`` (compiled in ``mode``, eager when None) with fused
    Adam over ``params``."""
    fn = loss_fn if mode is None else torch.compile(loss_fn, mode=mode, fullgraph=True,
                                                    dynamic=False)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    leaves = [x for x in inputs if x.requires_grad]

    def step() -> None:
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        fn(*inputs).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for x in leaves:
            x.grad = None
    return step


def adam_step(torch: Any, params: list) -> Callable[[], None]:
    """``ADAM_ONLY``'s step: fused Adam over ``params`` whose gradients stay set."""
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    return opt.step


def rows(row: Callable[..., dict[str, Any]], torch: Any,
         warn: Callable[[str], None]) -> Iterator[list[dict[str, Any]]]:
    """The torch_train rows of one run, a list per model and shape as each is measured (so a
    run cut short keeps what it measured); ``row(op, shape, pass, provider, result)`` adds the
    run's common columns. A shape's providers are timed in turns (``wall_us``); one that fails
    gets an error row, never ends the run."""
    for model in MODELS:
        for shape in SHAPES[model]:
            label = f"{model} {dims_label(shape)}"
            steps, failed = {}, {}
            for provider, (impl, mode) in (*PROVIDERS.items(), (ADAM_ONLY, ("library", None))):
                try:
                    library, plain, lib_params, plain_params = models(torch, model)
                    fn, params = (library, lib_params) if impl == "library" else \
                        (plain, plain_params)
                    step = adam_step(torch, params) if provider == ADAM_ONLY else \
                        train_step(torch, fn, params, batch(torch, model, shape), MODES[mode])
                    steps[provider] = (step, torch.cuda.synchronize)
                except Exception as exc:
                    failed[provider] = error(exc)
            timed = {**wall_us(steps), **failed}
            for provider, result in timed.items():
                if "error" in result:
                    warn(f"torch_train {label} {provider}: {result['error']}")
            yield [row(TORCH_TRAIN_OP, label, FWD_BWD, provider, timed[provider])
                   for provider in (*PROVIDERS, ADAM_ONLY)]
