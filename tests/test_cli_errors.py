"""CPU: every malformed argument of the tuning commands ends in one line and exit status 2,
before any GPU work; corrupt files name themselves; a broken tuned table means the defaults."""
import importlib.util
import logging
import subprocess
import sys

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
    ([*GOOD, "--trials", "0"], "expected a positive integer, got 0"),
    ([*GOOD, "--trials", "many"], "expected a positive integer"),
    ([*GOOD, "--storage", "bogus://x"], "unsupported"),
    ([*GOOD, "--storage", "sqlite:////no/such/folder/x.db"], "/no/such/folder does not exist"),
    (["--kernel", "pool.nope", "--shape", "B=2,K=8"], "--kernel 'pool.nope' is unknown"),
    ([*GOOD, "--reps", "0"], "expected a positive integer, got 0"),
    ([*GOOD, "--jobs", "0"], "expected a positive integer, got 0"),
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
    args = parser().parse_args([command, "--reports", str(tmp_path), "--slug", "g"])
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
