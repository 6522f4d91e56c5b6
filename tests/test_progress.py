"""CPU: long work shows its progress: a bar on a terminal, a log line per step anywhere else
(check, validate, bench, sweep and report all go through these)."""
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycuda_heads import progress
from pycuda_heads.progress import Steps

ROOT = Path(__file__).resolve().parents[1]


def test_in_a_log_each_step_is_one_line(caplog, capsys):
    with caplog.at_level(logging.INFO, "pycuda_heads"), Steps(3, "check", "variant") as steps:
        for label in ("pool.forward sm_90", "pool.backward sm_90", ""):
            steps.step(label)
    assert [r.getMessage() for r in caplog.records] == [
        "check: 1/3 variant (pool.forward sm_90)", "check: 2/3 variant (pool.backward sm_90)",
        "check: 3/3 variant"]
    assert capsys.readouterr().err == ""  # no bar's carriage returns in a log


def test_on_a_terminal_a_bar_is_drawn_instead(monkeypatch, caplog, capsys):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    with caplog.at_level(logging.INFO, "pycuda_heads"), Steps(2, "bench", "case") as steps:
        steps.step("pool B=2,K=8 forward tuned")
        steps.step("pool B=2,K=8 forward default")
    assert not caplog.records
    err = capsys.readouterr().err
    assert "bench" in err and "2/2" in err and "case" in err


def test_disabled_shows_nothing(caplog, capsys):
    with caplog.at_level(logging.INFO, "pycuda_heads"), Steps(2, "x", enabled=False) as steps:
        steps.step("a")
    assert not caplog.records and capsys.readouterr().err == ""


def test_the_tuners_bars_log_a_line_per_trial(caplog, capsys):
    pytest.importorskip("optuna")
    from pycuda_heads.tuning.progress import Progress
    with caplog.at_level(logging.INFO, "pycuda_heads"):
        with Progress().bar(2, "pool.forward B=2,K=8") as bar:
            bar.candidate({"BLOCK": 128})
            bar.done(None)
            bar.done(3.25)
        with Progress(enabled=False).bar(2, "quiet") as bar:
            bar.done(1.0)
    assert [r.getMessage() for r in caplog.records] == [
        "pool.forward B=2,K=8: 1/2 trial, best -", "pool.forward B=2,K=8: 2/2 trial, best 3.25 us"]
    assert "%|" not in capsys.readouterr().err


def test_the_static_check_logs_each_variant(monkeypatch, caplog):
    from pycuda_heads.catalog import catalog
    from pycuda_heads.verify import static_check
    monkeypatch.setattr(static_check, "check_kernel", lambda spec, params, arch: (spec.id, arch))
    todo = static_check.jobs(catalog(), False, ("sm_90",))
    with caplog.at_level(logging.INFO, "pycuda_heads"):
        reports = static_check.run_checks(todo, workers=2)
    assert reports == [(spec.id, arch) for spec, _, arch in todo]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(todo)
    assert lines[-1] == f"check: {len(todo)}/{len(todo)} variant ({todo[-1][0].id} sm_90)"


def test_report_logs_a_line_per_plot_when_stderr_is_not_a_terminal(tmp_path):
    pytest.importorskip("matplotlib")
    shutil.copytree(ROOT / "tests" / "fixtures" / "report", tmp_path / "reports")
    proc = subprocess.run([sys.executable, "-m", "pycuda_heads", "report"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "pycuda_heads.progress" in line]
    assert lines and all(" plot (" in line for line in lines)
    done, total = lines[-1].split(": ")[2].split(" ")[0].split("/")
    assert done == total
