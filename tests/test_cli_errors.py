"""CPU: every malformed argument of every command ends in one line naming it and exit status 2,
before any GPU work; a missing extra is named in one line; corrupt files name themselves; a
broken tuned table means the defaults."""
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycuda_heads.core import tuned

GOOD = ["--kernel", "pool.forward", "--shape", "B=2,K=8"]
MALFORMED = [
    (["--kernel", "pool.forward", "--shape", "B4096"], "--shape: expected NAME=INT"),
    (["--kernel", "pool.forward", "--shape", "B=x,K=8"], "--shape: B must be an integer"),
    (["--kernel", "pool.forward", "--shape", "B=2"], "pool.forward takes B, K"),
    (["--kernel", "pool.forward", "--shape", "B=0,K=-5"], "B=0, K=-5 must be >= 1"),
    ([*GOOD, "--template", "N_HORIZONS"], "--template: expected NAME=INT"),
    ([*GOOD, "--template", "N_ATOMS=3"], "takes HIDDEN_DIM, N_HORIZONS"),
    ([*GOOD, "--template", "N_HORIZONS=0"], "N_HORIZONS=0 must be >= 1"),
    ([*GOOD, "--trials", "0"], "expected an integer >= 1, got '0'"),
    ([*GOOD, "--trials", "many"], "expected an integer >= 1"),
    ([*GOOD, "--storage", "bogus://x"], "unsupported"),
    ([*GOOD, "--storage", "sqlite:////no/such/folder/x.db"], "/no/such/folder does not exist"),
    (["--kernel", "pool.nope", "--shape", "B=2,K=8"], "--kernel 'pool.nope' is unknown"),
    ([*GOOD, "--reps", "0"], "expected an integer >= 1, got '0'"),
    ([*GOOD, "--jobs", "0"], "expected an integer >= 1, got '0'"),
]


# The tuner needs Optuna (the tune extra).
TUNER = importlib.util.find_spec("optuna") is not None
needs_tuner = pytest.mark.skipif(not TUNER, reason="the tuner needs Optuna: pip install -e '.[test]'")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "pycuda_heads.cli", *args], capture_output=True,
                          text=True, timeout=120)


@needs_tuner
@pytest.mark.parametrize("args,message", MALFORMED, ids=lambda v: str(v)[:40])
def test_a_malformed_argument_exits_2_with_one_line(args, message, monkeypatch, capsys):
    from pycuda_heads.tuning import objective
    monkeypatch.setattr(objective.GpuContext, "current",  # reached only by a bug
                        classmethod(lambda cls: pytest.fail("GPU work before the checks")))
    from pycuda_heads.cli import main
    try:
        status = main(["tune", *args])
    except SystemExit as exc:  # argparse's own checks
        status = exc.code
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert status == 2 and len(lines) == 1 and message in lines[0]


# Every subcommand's malformed invocations, run in a folder holding a file "afile" and a
# reports folder "reports" whose one GPU folder "g" has no tuning data. Each names its input.
TUNE = ["tune", *GOOD]
TUNER_COMMANDS = ("tune", "sweep", "export", "prune", "efficiency")
EVERY_COMMAND = [
    ([], "the following arguments are required: command"),
    (["nosuchcmd"], "invalid choice: 'nosuchcmd'"),
    (["--nosuch", "check"], "unrecognized arguments: --nosuch"),
    (["check", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["check", "--jobs", "0"], "argument --jobs: expected an integer >= 1, got '0'"),
    (["check", "--jobs", "-1"], "argument --jobs: expected an integer >= 1, got '-1'"),
    (["check", "--jobs", "x"], "argument --jobs: expected an integer >= 1, got 'x'"),
    (["check", "--arch", "sm_xx"],
     "argument --arch: expected an SM target such as sm_90, got 'sm_xx'"),
    (["check", "--arch", "90"], "got '90'"),
    (["check", "--arch", "sm_90", "compute_90"], "got 'compute_90'"),
    (["check", "--arch"], "argument --arch: expected at least one argument"),
    (["validate", "--kernels", "nosuch"],
     "argument --kernels: expected comma-separated kernels or families among adam"),
    (["validate", "--kernels", "pool.nope"], "got 'pool.nope'"),
    (["validate", "--kernels", "pool,"], "got 'pool,'"),
    (["validate", "--kernels", "pool", "gate"], "unrecognized arguments: gate"),
    (["validate", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["validate", "--out", "afile/sub"], "--out afile/sub: afile is a file, not a folder"),
    (["validate", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["bench", "--ops", "nosuch"], "argument --ops: expected comma-separated ops among adam"),
    (["bench", "--ops", "pool.forward"], "got 'pool.forward'"),
    (["bench", "--ops"], "argument --ops: expected one argument"),
    (["bench", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["bench", "--quick=yes"], "argument --quick: ignored explicit argument 'yes'"),
    (["bench", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["smoke", "--steps", "0"], "argument --steps: expected an integer >= 1, got '0'"),
    (["smoke", "--steps", "-3"], "argument --steps: expected an integer >= 1, got '-3'"),
    (["smoke", "--steps", "x"], "argument --steps: expected an integer >= 1, got 'x'"),
    (["smoke", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["smoke", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["report", "--out", "no/such"], "--out no/such does not exist"),
    (["report", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["report", "--gpu", "nosuchgpu"], "--gpu nosuchgpu: no data under reports; GPUs with data: g"),
    (["report", "--gpu", "g,nosuchgpu"], "--gpu nosuchgpu: no data under reports"),
    (["report", "--gpu"], "argument --gpu: expected one argument"),
    (["report", "--reports", "reports"], "unrecognized arguments: --reports reports"),
    (["report", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["identity", "pool"], "the following arguments are required: --base, --proof"),
    (["identity", "nosuch", "--base", "HEAD", "--proof", "p.json"], "invalid choice: 'nosuch'"),
    (["identity", "pool", "--base", "no-such-rev", "--proof", "p.json"],
     "--base no-such-rev: not a commit"),
    (["identity", "pool", "--base", "HEAD", "--proof", "p.json", "--sample", "-1"],
     "argument --sample: expected an integer >= 0, got '-1'"),
    (["restamp", "pool"], "the following arguments are required: --proof"),
    (["restamp", "nosuch", "--proof", "p.json"], "invalid choice: 'nosuch'"),
    *((["tune", *args], message) for args, message in MALFORMED),
    (["tune"], "the following arguments are required: --kernel, --shape"),
    (["tune", "--kernel", "pool", "--shape", "B=2,K=8"], "--kernel 'pool' is unknown"),
    (["tune", "--kernel", "pool.forward", "--shape", "B=2,K=8,K=9"], "K given more than once"),
    (["tune", "--kernel", "pool.forward", "--shape", "B=99999999999,K=8"],
     "B=99999999999 exceeds 2147483647"),
    (["tune", "--kernel", "adam.step", "--shape", "N=5", "--template", "N_HORIZONS=3"],
     "adam.step takes no template constants"),
    ([*TUNE, "--try", "{bad"], "argument --try: expected a JSON object, got '{bad'"),
    ([*TUNE, "--try", "[]"], "argument --try: expected a JSON object of knobs, got '[]'"),
    ([*TUNE, "--try", '{"NOPE": 1}'], '--try {"NOPE": 1}: no kernel of this run'),
    ([*TUNE, "--try", '{"BLOCK": 7}'], "BLOCK=7 is not one of"),
    ([*TUNE, "--trials", "-3"], "argument --trials: expected an integer >= 1, got '-3'"),
    ([*TUNE, "--reps", "-1"], "argument --reps: expected an integer >= 1, got '-1'"),
    ([*TUNE, "--jobs", "-1"], "argument --jobs: expected an integer >= 1, got '-1'"),
    ([*TUNE, "--workers", "0"], "argument --workers: expected an integer >= 1, got '0'"),
    ([*TUNE, "--mode", "nope"], "argument --mode: invalid choice: 'nope'"),
    ([*TUNE, "--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
    ([*TUNE, "--seed", str(2 ** 32)],
     f"argument --seed: expected a seed below 2**32, got {2 ** 32}"),
    ([*TUNE, "--worker-seed", "x"], "argument --worker-seed: expected an integer >= 0, got 'x'"),
    ([*TUNE, "--warmup", "-1"], "argument --warmup: expected an integer >= 0, got '-1'"),
    ([*TUNE, "--time-budget", "-5"], "argument --time-budget: expected seconds > 0, got '-5'"),
    ([*TUNE, "--time-budget", "nan"], "argument --time-budget: expected seconds > 0, got 'nan'"),
    ([*TUNE, "--time-budget", "soon"], "argument --time-budget: expected seconds > 0, got 'soon'"),
    ([*TUNE, "--out", "afile"], "--out afile: afile is a file, not a folder"),
    ([*TUNE, "--out", "afile/reports"], "--out afile/reports: afile is a file, not a folder"),
    ([*TUNE, "--nosuch"], "unrecognized arguments: --nosuch"),
    (["sweep", "--kernels", "nosuch"], "--kernels 'nosuch': unknown kernels nosuch"),
    (["sweep", "--kernels", "pool"], "--kernels 'pool': unknown kernels pool"),
    (["sweep", "--kernels", "pool.forward,"], "--kernels 'pool.forward,' names an empty kernel"),
    (["sweep", "--trials", "0"], "argument --trials: expected an integer >= 1, got '0'"),
    (["sweep", "--jobs", "0"], "argument --jobs: expected an integer >= 1, got '0'"),
    (["sweep", "--reps", "-2"], "argument --reps: expected an integer >= 1, got '-2'"),
    (["sweep", "--try", "{bad"], "argument --try: expected a JSON object, got '{bad'"),
    (["sweep", "--try", '{"NOPE": 1}'], '--try {"NOPE": 1}: no kernel of this run'),
    (["sweep", "--time-budget", "0"], "argument --time-budget: expected seconds > 0, got '0'"),
    (["sweep", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["sweep", "--storage", "bogus://x"], "--storage bogus://x: unsupported"),
    (["sweep", "--mode", "nope"], "argument --mode: invalid choice: 'nope'"),
    (["sweep", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["export", "--out", "no/such"], "--out no/such does not exist"),
    (["export", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["export", "--gpu", "nosuch"], "reports/nosuch/tuning"),
    (["export"], "no tuning data under reports"),
    (["export", "--slug", "g"], "unrecognized arguments: --slug g"),
    (["export", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["prune", "--out", "no/such"], "--out no/such does not exist"),
    (["prune", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["prune", "--gpu", "g"], "no journal at reports/g/tuning/optuna.journal"),
    (["prune"], "no tuning data under reports"),
    (["prune", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["efficiency", "--out", "no/such"], "--out no/such does not exist"),
    (["efficiency", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["efficiency", "--seeds", "0"], "argument --seeds: expected an integer >= 1, got '0'"),
    (["efficiency", "--seeds", "-1"], "argument --seeds: expected an integer >= 1, got '-1'"),
    (["efficiency", "--within", "0"], "argument --within: expected a fraction in (0, 1), got '0'"),
    (["efficiency", "--within", "5"], "argument --within: expected a fraction in (0, 1), got '5'"),
    (["efficiency", "--within", "nan"],
     "argument --within: expected a fraction in (0, 1), got 'nan'"),
    (["efficiency", "--within", "x"], "argument --within: expected a fraction in (0, 1), got 'x'"),
    (["efficiency", "--gpu", "nosuch"], "--gpu 'nosuch' has no tuning data under reports"),
    (["efficiency", "--nosuch"], "unrecognized arguments: --nosuch"),
    (["efficiency", "--adopt"], "--adopt needs --measure: it times on this GPU"),
    (["efficiency", "--measure", "--gpu", "g"], "--gpu names stored data to replay; --measure"),
    (["efficiency", "--task", "pool.forward"], "--task 'pool.forward': expected KERNEL:SHAPE"),
    (["efficiency", "--task", "pool.nope:B=2,K=8"], "--kernel 'pool.nope' is unknown"),
    (["efficiency", "--task", "pool.forward:B=2"], "--shape 'B=2': pool.forward takes B, K"),
    (["efficiency", "--task", "pool.forward:B=2,K=8:X=3"],
     "--template 'X=3': pool.forward takes HIDDEN_DIM, N_HORIZONS"),
    (["efficiency", "--samplers", "tpe,nope"], "--sampler 'nope' is unknown; samplers: tpe"),
    (["efficiency", "--measure", "--chain-trials", "101"],
     "--chain-trials 101: at most 100, the largest budget a curve draws"),
    (["efficiency", "--chain-trials", "25"], "--chain-trials needs --measure"),
    (["efficiency", "--reference-trials", "0"],
     "argument --reference-trials: expected an integer >= 1, got '0'"),
    (["efficiency", "--measure", "--time-budget", "0"],
     "argument --time-budget: expected seconds > 0, got '0'"),
    (["tune", *GOOD, "--sampler", "nope"], "--sampler 'nope' is unknown; samplers: tpe"),
]


def _case(args, message):
    marks = [needs_tuner] if args[:1] and args[0] in TUNER_COMMANDS else []
    return pytest.param(args, message, marks=marks, id=" ".join(args)[:60] or "no arguments")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with a file "afile" and reports/g/tuning (a GPU folder without caches)."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "reports" / "g" / "tuning").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    if TUNER:
        from pycuda_heads.tuning import objective
        monkeypatch.setattr(objective.GpuContext, "current",  # reached only by a bug
                            classmethod(lambda cls: pytest.fail("GPU work before the checks")))
    return tmp_path


def run_main(args, capsys):
    """(exit status, stderr lines) of ``pycuda-heads ARGS`` run in this process."""
    from pycuda_heads.cli import main
    try:
        status = main(args)
    except SystemExit as exc:  # argparse's own checks
        status = exc.code
    captured = capsys.readouterr()
    assert captured.out == ""
    return status, [line for line in captured.err.splitlines() if line.strip()]


def test_the_table_covers_every_subcommand_with_60_cases():
    commands = {args[0] for args, _ in EVERY_COMMAND if args and not args[0].startswith("-")}
    assert len(EVERY_COMMAND) >= 60
    assert {"check", "validate", "tune", "sweep", "export", "prune", "efficiency", "bench",
            "smoke", "report"} <= commands


@pytest.mark.parametrize("args,message", [_case(*c) for c in EVERY_COMMAND])
def test_every_malformed_invocation_exits_2_with_one_line_naming_it(args, message, workdir,
                                                                    capsys):
    status, lines = run_main(args, capsys)
    assert status == 2 and len(lines) == 1, lines
    assert message in lines[0] and "Traceback" not in lines[0]
    assert not (workdir / "no").exists()  # a missing results folder is not created


# The base install (pip install pycuda-heads, no extra): the extras' imports fail.
EXTRAS = ("optuna", "sqlalchemy", "scipy", "tqdm", "matplotlib", "torch", "pycuda", "psycopg")


@pytest.mark.parametrize("args,message", [pytest.param(*c, id=" ".join(c[0])[:60] or "none")
                                          for c in EVERY_COMMAND])
def test_in_the_base_install_every_malformed_invocation_exits_2_with_one_line(
        args, message, workdir, monkeypatch, capsys):
    for name in EXTRAS:
        monkeypatch.setitem(sys.modules, name, None)
    status, lines = run_main(args, capsys)
    assert status == 2 and len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    if args[:1] and args[0] in TUNER_COMMANDS:  # the tuner cannot run: its extra is named
        assert f"pycuda-heads {args[0]}: the tuner is unavailable" in lines[0]
        assert "pip install -e '.[tune]'" in lines[0]
    else:
        assert message in lines[0]


class _Driver:
    """libcuda as ctypes sees it: ``status`` from cuInit, ``devices`` from cuDeviceGetCount."""

    def __init__(self, status, devices):
        self.status, self.devices = status, devices

    def cuInit(self, flags):
        return self.status

    def cuDeviceGetCount(self, count):
        count._obj.value = self.devices
        return 0

    def cuGetErrorName(self, status, name):
        name._obj.value = b"CUDA_ERROR_NO_DEVICE" if status == 100 else None
        return 0


def _no_libcuda(name):
    raise OSError(f"{name}: cannot open shared object file")


@pytest.mark.parametrize("driver,message", [
    (_no_libcuda, "no NVIDIA driver (libcuda.so.1 not found)"),
    (lambda name: _Driver(100, 0), "no CUDA device (CUDA_ERROR_NO_DEVICE)"),
    (lambda name: _Driver(0, 0), "no CUDA device (no device)"),
], ids=["no driver", "driver without a device", "no device counted"])
def test_check_device_without_a_gpu_ends_in_one_line_before_nvcc(driver, message, workdir,
                                                                 monkeypatch, capsys):
    import ctypes
    from pycuda_heads.verify import static_check
    monkeypatch.setattr(ctypes, "CDLL", driver)
    monkeypatch.setattr(static_check, "nvcc_version",
                        lambda: pytest.fail("nvcc asked before the device"))
    status, lines = run_main(["check", "--device"], capsys)
    assert status == 2 and len(lines) == 1
    assert lines[0] == (f"pycuda-heads check: no GPU to run on, {message}: the GPU commands "
                        "need an NVIDIA GPU with its driver, and PyCUDA's build the CUDA toolkit")


def test_check_device_with_a_gpu_goes_on_to_the_static_check(workdir, monkeypatch, capsys):
    import ctypes
    from pycuda_heads.verify import static_check
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Driver(0, 2))

    def no_nvcc():
        raise static_check.NvccUnavailableError("nvcc not found")
    monkeypatch.setattr(static_check, "nvcc_version", no_nvcc)
    from pycuda_heads.cli import main
    assert main(["check", "--device"]) == 2  # the static check ran: it found no nvcc
    captured = capsys.readouterr()
    assert captured.out == "2 CUDA device(s)\n" and "nvcc not found" in captured.err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="asks nvcc which archs it has")
def test_an_arch_nvcc_lacks_is_named_before_any_compile(workdir, capsys):
    status, lines = run_main(["check", "--arch", "sm_90", "sm_10"], capsys)
    assert status == 2 and len(lines) == 1
    assert "--arch sm_10: not supported by this nvcc" in lines[0] and "sm_90" in lines[0]


def test_a_missing_reports_folder_is_neither_created_nor_reported_written(tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    status, lines = run_main(["report", "--out", str(missing)], capsys)
    assert status == 2 and lines == [f"pycuda-heads report: --out {missing} does not exist"]
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("args,message", [
    (["check", "--jobs", "0"], "expected an integer >= 1, got '0'"),
    (["smoke", "--steps", "-3"], "expected an integer >= 1, got '-3'"),
    (["validate", "--out", "afile"], "--out afile: afile is a file"),
    (["report", "--out", "no/such"], "--out no/such does not exist"),
    (["report", "--gpu", "nosuchgpu"], "--gpu nosuchgpu: no data under reports"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_the_command_prints_one_line_in_a_fresh_process(args, message, workdir):
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "pycuda_heads.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=workdir,
                          env={**os.environ, "PYTHONPATH": str(root)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0] and not proc.stdout
    assert not (workdir / "no").exists()


# The base install: the tuner's extra missing. A shim of None in sys.modules makes its import fail.
@pytest.mark.parametrize("args", [["tune", *GOOD], ["tune", "--trials", "0"], ["sweep"],
                                  ["export"], ["prune"], ["efficiency", "--seeds", "2"]],
                         ids=lambda v: " ".join(v))
def test_without_the_tune_extra_the_tuning_commands_name_it(args, workdir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)
    status, lines = run_main(args, capsys)
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith(f"pycuda-heads {args[0]}: the tuner is unavailable (optuna")
    assert "pip install -e '.[tune]'" in lines[0]


def test_without_the_tune_extra_a_fresh_process_prints_one_line(workdir):
    root = Path(__file__).resolve().parents[1]
    shim = ("import sys; sys.modules['optuna'] = None; from pycuda_heads.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", shim, "tune", *GOOD], capture_output=True,
                          text=True, timeout=120, cwd=workdir,
                          env={**os.environ, "PYTHONPATH": str(root)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "'.[tune]'" in lines[0]


def test_without_the_report_extra_report_names_it_in_one_line(workdir, monkeypatch, capsys):
    # the tables are still written (exit 0): only the plots need matplotlib
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    from pycuda_heads.cli import main
    assert main(["report"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "matplotlib is missing" in err[0]
    assert "pip install '.[report]'" in err[0]
    assert (workdir / "reports" / "g" / "README.md").is_file()


@needs_tuner
def test_more_workers_than_visible_gpus_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    from pycuda_heads.cli import main
    assert main(["tune", *GOOD, "--workers", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "CUDA_VISIBLE_DEVICES names 1" in lines[0]


@needs_tuner
@pytest.mark.installed
@pytest.mark.parametrize("args,message", MALFORMED[:3] + MALFORMED[7:10],
                         ids=lambda v: str(v)[:40])
def test_the_command_prints_one_line(args, message):
    proc = cli("tune", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_a_corrupt_cache_names_the_file(tmp_path, monkeypatch, capsys):
    from test_tuning import parser
    from pycuda_heads.tuning import constraints, objective
    fake = objective.GpuContext("Fake H200", "fake-h200", "sm_90", 227 * 1024)
    monkeypatch.setattr(objective.GpuContext, "current", classmethod(lambda cls: fake))
    monkeypatch.setattr(objective.GpuContext, "precompile", lambda self, items, workers: None)
    monkeypatch.setattr(constraints, "spec_static", lambda task, arch: lambda p: None)
    bad = tmp_path / "fake-h200" / "tuning" / "pool.forward__HIDDEN_DIM=128,N_HORIZONS=5__B=2,K=8.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"evaluations": [')
    args = parser().parse_args(["tune", *GOOD, "--out", str(tmp_path), "--no-progress"])
    args.command = "tune"
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "not valid JSON" in err[0]


@needs_tuner
@pytest.mark.parametrize("command", ["export", "efficiency"])
def test_a_corrupt_cache_names_the_file_in_export_and_efficiency(tmp_path, capsys, command):
    from test_tuning import parser
    bad = tmp_path / "g" / "tuning" / "gate.forward__N_HORIZONS=5__B=3.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"evaluations": [')
    args = parser().parse_args([command, "--out", str(tmp_path), "--gpu", "g"])
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "not valid JSON" in err[0]


def test_an_unwritable_reports_folder_exits_2(tmp_path, capsys):
    from test_tuning import parser
    (tmp_path / "file").write_text("")
    args = parser().parse_args(["tune", *GOOD, "--out", str(tmp_path / "file" / "reports")])
    args.command = "tune"
    assert args.func(args) == 2 and "file" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", '{"entries": [', '{"entries": [{"kernel": "pool.forward"}]}',
                                  "[]"])
def test_a_broken_tuned_table_means_the_defaults_with_one_warning(tmp_path, monkeypatch,
                                                                  caplog, text):
    (tmp_path / "g.json").write_text(text)
    monkeypatch.setenv("PYCUDA_HEADS_TUNED_DIR", str(tmp_path))
    monkeypatch.setattr(tuned, "_WARNED", set())
    with caplog.at_level(logging.WARNING, "pycuda_heads"):
        for _ in range(3):
            params, why = tuned.lookup("pool.forward", {}, {"B": 2, "K": 8}, "g")
            assert params is None and why == "default (no tuned table for g)"
    [record] = caplog.records
    assert str(tmp_path / "g.json") in record.getMessage()


@pytest.mark.parametrize("command", ["bench", "validate", "smoke"])
def test_gpu_commands_without_pycuda_print_one_line(command):
    from pycuda_heads.core.device import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present")
    proc = cli(command)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and not proc.stdout
    assert lines[0].startswith(f"pycuda-heads {command}: ")
    assert "pip install '.[gpu]'" in lines[0] and "nvcc" in lines[0]


def test_check_without_nvcc_prints_one_line(tmp_path):
    import os
    proc = subprocess.run([sys.executable, "-m", "pycuda_heads.cli", "check"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": str(tmp_path)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "nvcc" in lines[0] and not proc.stdout
