"""CPU: the package imports and its CLI answers without PyCUDA; spaces behave; ops need a GPU."""
import subprocess
import sys

import pytest

import pycuda_heads as ph
from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.core.space import KernelSpace


def test_import_needs_no_gpu():
    code = ("import sys, pycuda_heads; assert 'pycuda' not in sys.modules; "
            "print(pycuda_heads.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ph.__version__


def test_cli_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "pycuda_heads.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for command in ("check", "validate", "tune", "sweep", "export", "bench", "report"):
        assert command in out


def test_constructing_an_op_without_gpu_says_why():
    if ph.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ph.GpuUnavailableError):
        ph.PerHorizonAttentionPool(5, 128)


def test_space_restrictions_and_completion():
    space = KernelSpace("toy.k", {"BLOCK": (32, 64), "VEC": (1, 4)}, {"BLOCK": 64, "VEC": 4},
                        restrictions=("HIDDEN_DIM % VEC == 0",),
                        launch_restrictions=("SHARED_BYTES <= MAX_SHARED_BYTES",),
                        shared_bytes=lambda p, env: 4 * env["K"] * p["BLOCK"])
    assert space.violated({"BLOCK": 32, "VEC": 4}, {"HIDDEN_DIM": 30}) == "HIDDEN_DIM % VEC == 0"
    assert space.points({"HIDDEN_DIM": 30}) == [{"BLOCK": 32, "VEC": 1}, {"BLOCK": 64, "VEC": 1}]
    shape = {"K": 300, "MAX_SHARED_BYTES": 4 * 300 * 32}
    assert [p["BLOCK"] for p in space.points({"HIDDEN_DIM": 128}, shape)] == [32, 32]
    assert space.complete({"BLOCK": 32}) == {"BLOCK": 32, "VEC": 4}
    with pytest.raises(ValueError, match="VEC=3 is not one of"):
        space.complete({"VEC": 3})
    # with the template, a default breaking a restriction beside the given knobs gives way
    assert space.complete({"BLOCK": 32}, {"HIDDEN_DIM": 30}) == {"BLOCK": 32, "VEC": 1}


def test_points_prune_early_and_agree_with_checking_every_combination():
    import itertools
    params = {"A": (1, 2, 3), "B": (0, 1), "C": (4, 8, 16), "D": (0, 1)}
    space = KernelSpace("toy.k", params, {"A": 1, "B": 0, "C": 4, "D": 0},
                        restrictions=("A != 3 or B == 0", "C * A <= 24 + N", "D == 0 or C == 16"))
    every = [dict(zip(params, v)) for v in itertools.product(*params.values())]
    for n in (0, 24):
        assert space.points({"N": n}) == [p for p in every if space.violated(p, {"N": n}) is None]


@pytest.mark.parametrize("kernel", sorted(catalog().specs))
def test_every_default_is_a_valid_point_of_its_space(kernel):
    spec = catalog()[kernel]
    template = spec.template(SUITE_TEMPLATE)
    assert spec.space.violated(dict(spec.space.default), template) is None
    assert dict(spec.space.default) in spec.space.points(template)


def test_the_torch_module_without_torch_says_which_extra_to_install():
    # torch made unimportable, whether or not it is installed here
    code = "import sys; sys.modules['torch'] = None; import pycuda_heads.torch"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == ('ImportError: pycuda_heads.torch needs '
                                                    'PyTorch: pip install "pycuda-heads[torch]"')


def test_version_is_one_value_and_the_command_says_it():
    from pycuda_heads import records
    for argv in (["-m", "pycuda_heads", "--version"], ["-c", "import pycuda_heads as ph; "
                                                             "print('pycuda-heads', ph.__version__)"]):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stdout.strip() == f"pycuda-heads {records.VERSION}"
