"""CPU: the package's structure. Imports flow one way (no cycle; each layer imports only the
layers ARCHITECTURE.md allows it), light imports stay light, argument types come from the C
signatures, and a new kernel family is picked up everywhere by adding its files alone."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pycuda_heads
from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.core.op import Op
from pycuda_heads.core.source import arg_types, render
from pycuda_heads.core.space import KernelSpace
from pycuda_heads.core.spec import KernelSpec, Tensor

PACKAGE = Path(pycuda_heads.__file__).resolve().parent
TUNING = PACKAGE.parent / "tuning"
LAYERS = ("core", "ops", "verify", "perf", "report", "tuning")


def _module_files() -> dict[str, Path]:
    files = {}
    for root, prefix in ((PACKAGE, "pycuda_heads"), (TUNING, "pycuda_heads.tuning")):
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((prefix, *parts))
            files[name.removesuffix(".__init__")] = path
    return files


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules ``name`` imports anywhere in its file (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # a submodule imported from a package depends on that submodule, not the package:
            # ``from .. import records`` is records, ``from .. import __version__`` the root
            targets = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            # the deepest known module the import names
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = _module_files()
    return {name: _imports(name, path, set(files)) for name, path in files.items()}


def test_the_import_graph_has_no_cycle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


#: the layer of the root package ``pycuda_heads/__init__.py`` (no module can be named so)
ROOT = "__init__"


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


# ARCHITECTURE.md's table: what each layer may import besides itself. An entry is a layer or one
# module of it ("core.spec"); where a layer's entry names one of its own modules ("ops.reduce"),
# its modules may import only those of their layer. The root re-exports the public API: it is the
# top layer, and no layer may import it.
ALLOWED = {ROOT: {"ops", "step", "catalog", "core", "records"},
           "reference": set(), "records": set(), "progress": set(), "core": {"records"},
           "ops": {"core", "reference", "ops.reduce", "ops.frdhead", "ops.frd"},
           "step": {"core", "ops"},
           "torch": {"core", "ops", "step"}, "catalog": {"ops", "core.spec", "records"},
           "verify": {"catalog", "core", "records", "progress"},
           "perf": {"catalog", "core", "step", "records", "torch", "progress"},
           "tuning": {"catalog", "core", "verify", "perf.timing", "records", "progress"},
           "report": {"records", "progress"}, "smoke": {"ops", "step", "core", "reference", "records"}}


def _allowed(layer: str, target: str) -> bool:
    name = target.partition(".")[2]  # "pycuda_heads.ops.reduce" -> "ops.reduce"; root -> ""
    rules = ALLOWED[layer]
    if _layer(target) in rules or any(name == r or name.startswith(f"{r}.") for r in rules):
        return True
    return _layer(target) == layer and not any(r.startswith(f"{layer}.") for r in rules)


def _checked_modules() -> list[str]:
    """Every module of a layer in the table."""
    return [name for name in sorted(_module_files()) if _layer(name) in ALLOWED]


def test_every_layer_of_the_table_has_modules(graph: dict[str, set[str]]) -> None:
    assert set(ALLOWED) <= {_layer(m) for m in graph}


@pytest.mark.parametrize("module", _checked_modules())
def test_each_module_imports_only_what_the_architecture_allows(graph: dict[str, set[str]],
                                                               module: str) -> None:
    layer = _layer(module)
    assert not sorted(t for t in graph[module] if not _allowed(layer, t)), \
        f"layer {layer} may import {sorted(ALLOWED[layer])}"


def test_importing_the_package_and_its_catalog_loads_no_heavy_dependency() -> None:
    code = ("import sys, pycuda_heads; from pycuda_heads.catalog import catalog; "
            "cat = catalog(); assert len(cat.specs) >= 8; "
            "print(sorted(m for m in ('optuna', 'matplotlib', 'scipy', 'tqdm', 'torch', "
            "'pycuda') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_prepared_call_types_are_read_from_the_c_signature(kernel: str) -> None:
    spec = catalog()[kernel]
    source = render(spec.family, {**spec.template(SUITE_TEMPLATE), **spec.space.default})
    for entry in spec.entries(spec.space.default):
        types = arg_types(source, entry)
        assert types and set(types) <= set("PifqId")


def test_argument_types_of_a_signature() -> None:
    source = ('extern "C" __global__ void __launch_bounds__(BLOCK)\n'
              'k(const float* __restrict__ a, int* b, const int n, const float s,\n'
              '  const long long t, const long long* __restrict__ table, const double beta)\n{}\n')
    assert arg_types(source, "k") == "PPifqPd"
    # bounds chosen by a macro (pool's LAYOUT 2 picks them by a knob)
    assert arg_types(source.replace("__launch_bounds__(BLOCK)", "MY_BOUNDS"), "k") == "PPifqPd"
    with pytest.raises(ValueError, match="no extern"):
        arg_types(source, "other")
    with pytest.raises(ValueError, match="cannot pass"):
        arg_types('extern "C" __global__ void k(short x) {}', "k")
    # the list written once as a macro that several kernels share (the pool's layouts)
    shared = ("#define K_PARAMS const float* __restrict__ a, int* b, const int n, \\\n"
              "    const float s\n"
              'extern "C" __global__ void __launch_bounds__(BLOCK) k(K_PARAMS)\n{}\n')
    assert arg_types(shared, "k") == "PPif"
    with pytest.raises(ValueError, match="not #defined"):
        arg_types(shared.replace("#define K_PARAMS", "#define OTHER"), "k")


# --- a toy family: its files alone put it in every derived table -----------------------------

TOY_CU = """// Toy family: y = 2 x.
#include "heads_common.cuh"
extern "C" __global__ void __launch_bounds__(BLOCK)
toy_scale(const float* __restrict__ x, float* __restrict__ y, const int n)
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = 2.f * x[i];
}
"""


@pytest.fixture()
def toy(tmp_path: Path) -> KernelSpec:
    (tmp_path / "toy.cu").write_text(TOY_CU)

    class Toy(Op):
        FAMILY = "toy"
        SOURCE_DIR = tmp_path
        SPACES = {"scale": KernelSpace(kernel="toy.scale", params={"BLOCK": (64, 128)},
                                       default={"BLOCK": 128})}

    return KernelSpec(op=Toy, method="scale", space=Toy.SPACES["scale"],
                      template_keys=(), tensors={"x": Tensor(("N",)), "y": Tensor(("N",))},
                      reads=("x",), writes=("y",),
                      reference=lambda x, dtype=np.float64: 2 * np.asarray(x, dtype),
                      suite=({"N": 1000},), grid=(({}, {"N": 1}),), source_dir=tmp_path)


def test_a_toy_family_appears_in_every_derived_table(toy: KernelSpec) -> None:
    from pycuda_heads.verify.static_check import jobs
    from pycuda_heads.verify.validation import variants_to_check
    cat = catalog().with_specs(toy)

    assert ("toy.scale", "sm_90") in {(s.id, arch) for s, _, arch in jobs(cat, False, ("sm_90",))}
    checked = {(s.id, src): shapes for s, _, src, shapes, _ in variants_to_check(cat, None)}
    assert checked["toy.scale", "default"] == [({}, {"N": 1}), ({}, {"N": 1000})]
    bench = [c for c in cat.bench_cases() if c.op == "toy"]
    assert [(c.pass_, c.shape, c.floor_bytes()) for c in bench] == [("scale", {"N": 1000}, 8000)]
    tasks = [(s.id, t, shape) for s, t, shape in cat.tasks() if s.family == "toy"]
    assert tasks == [("toy.scale", {}, {"N": 1000})]
    x = toy.make_inputs({}, {"N": 5}, seed=1)["x"]
    assert x.shape == (5,) and x.any()
    np.testing.assert_array_equal(toy.run_reference({"x": x})[0], 2 * x.astype(np.float64))


def test_the_toy_family_becomes_a_tuner_task(toy: KernelSpec) -> None:
    pytest.importorskip("optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
    from pycuda_heads.tuning.spaces import TuningTask
    task = TuningTask.from_spec(toy, {"N": 1000}, "G", "g")
    assert task.family == "toy" and task.source_hash


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_toy_family_passes_the_static_check(toy: KernelSpec) -> None:
    from pycuda_heads.verify.static_check import jobs, run_checks
    cat = catalog().with_specs(toy)
    todo = [j for j in jobs(cat, True, ("sm_90",)) if j[0].id == "toy.scale"]
    reports = run_checks(todo)
    assert len(reports) == 2 and all(r.ok for r in reports)
    assert list(reports[0].entries) == ["toy_scale"]
