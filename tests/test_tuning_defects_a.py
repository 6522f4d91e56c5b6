"""CPU: tuner defects found in multi-worker and killed runs: a zombie worker counted alive,
non-positive timings shipped, a history left short by a kill, temporary files left by kills."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from pycuda_heads.tuning import workers
from pycuda_heads.tuning.cache import Evaluation, TuningCache
from pycuda_heads.tuning.export import build_table
from pycuda_heads.tuning.spaces import point_key
from test_tuning import BEST_VALID, Comparing, by_key, load, run, toy_task, toy_time
from test_tuning_workers import ENV, check_consistent, worker

from pycuda_heads import records


def exited_unreaped(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` has exited, leaving it a zombie (its status not collected)."""
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


# --- 1. a dead worker not yet reaped by its parent ---------------------------------------------

def test_a_zombie_worker_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        exited_unreaped(child)
        assert not workers.pid_alive(child.pid)
        trial = SimpleNamespace(system_attrs={"worker": {"host": workers.HOST, "pid": child.pid}})
        assert workers.is_dead(trial)  # its RUNNING trial is failed and queued again
    finally:
        child.wait()
    assert workers.pid_alive(os.getpid())


@pytest.mark.installed  # workers run as new processes
def test_survivor_goes_on_when_a_sibling_worker_dies_unreaped(tmp_path):
    """As under ``--workers N``: the parent waits on another worker, so the killed one stays a
    zombie while the survivor runs; the survivor fails its trial and finishes the study."""
    log = tmp_path / "timed.log"
    killed = worker(tmp_path, log, "--trials", 15, "--seed", 1, "--kill", "timing:3")
    try:
        exited_unreaped(killed)  # dead inside its third trial, which stays RUNNING
        survivor = worker(tmp_path, log, "--trials", 15, "--seed", 2)
        try:
            _, err = survivor.communicate(timeout=90)
        finally:
            survivor.kill()
            survivor.wait()
        assert survivor.returncode == 0, err
    finally:
        killed.wait()
    assert killed.returncode == -signal.SIGKILL
    check_consistent(tmp_path, 15)


# --- 2. a zero or negative timing --------------------------------------------------------------

@pytest.mark.parametrize("bad", [0.0, -5.0])
def test_a_non_positive_timing_is_a_failure_never_the_best(tmp_path, bad):
    broken = {**BEST_VALID, "VEC": 4}  # the fastest point
    ev = Comparing(fail=(), time_fn=lambda p: bad if p == broken else toy_time(p))
    out = run(tmp_path, ev, mode="exhaustive")
    rec = by_key(load(tmp_path))[point_key(broken)]
    assert rec["state"] == "ERROR" and rec["time_us"] is None and not rec["validated"]
    assert "non-positive" in rec["reason"] and str(broken) in rec["reason"]
    assert out.best.params == BEST_VALID
    [entry] = build_table(tmp_path, "toy-gpu")["entries"]
    assert entry["params"] == BEST_VALID and entry["time_us"] == toy_time(BEST_VALID)


def test_a_non_positive_timing_in_an_old_cache_file_is_read_as_a_failure(tmp_path):
    run(tmp_path, Comparing(fail=()), mode="tpe", trials=5)
    path = next((tmp_path / "toy-gpu" / "tuning").glob("toy.kernel__*.json"))
    data = json.loads(path.read_text())
    data["evaluations"][0].update(time_us=-5.0, p20_us=-5.0, p80_us=-5.0, state="COMPLETE",
                                  validated=True)
    path.write_text(json.dumps(data))
    cache = TuningCache.load(toy_task(), path)
    params = data["evaluations"][0]["params"]
    assert cache.get(params).state == "ERROR"
    assert cache.best() is None or cache.best().time_us > 0
    ev = cache.put(Evaluation(params, "COMPLETE", time_us=0.0, p20_us=0.0, p80_us=0.0,
                              validated=True))
    assert ev.state == "ERROR" and ev.time_us is None


# --- 3. the history after a kill between a trial's tell and the cache save ------------------

def test_resume_rebuilds_a_history_left_short(tmp_path):
    run(tmp_path, Comparing(fail=()), mode="tpe", trials=6)
    path = next((tmp_path / "toy-gpu" / "tuning").glob("toy.kernel__*.json"))
    data = json.loads(path.read_text())
    assert len(data["history"]) == 6
    data["history"] = data["history"][:-1]  # the last trial told, its cache save never made
    path.write_text(json.dumps(data))
    again = run(tmp_path, Comparing(fail=()), mode="tpe", trials=6)
    assert again.trials == 0  # nothing run again
    assert [h["trial"] for h in load(tmp_path)["history"]] == list(range(6))
    assert build_table(tmp_path, "toy-gpu")["provenance"]["trials_run"] == 6


# --- 4. temporary files of killed writers ------------------------------------------------------

def test_a_later_write_removes_the_temporary_file_a_killed_writer_left(tmp_path):
    path = tmp_path / "runs.json"
    records.write_json(path, {"n": 0})
    killed = subprocess.run([sys.executable, "-c", (
        "import os, signal\nfrom pycuda_heads import records\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed before rename\n"
        f"records.write_json({str(path)!r}, {{'n': 1}})")], env=ENV)
    assert killed.returncode == -signal.SIGKILL
    assert len(list(tmp_path.glob("*.tmp"))) == 1  # what the kill left
    records.write_json(path, {"n": 2})
    assert not list(tmp_path.glob("*.tmp"))
    assert json.loads(path.read_text()) == {"n": 2}


def test_a_live_or_recent_writer_keeps_its_temporary_file(tmp_path):
    path = tmp_path / "cache.json"
    live = tmp_path / f".cache.json.{socket.gethostname()}-{os.getpid()}.abc_12.tmp"
    elsewhere = tmp_path / ".cache.json.other-host-1.abc_34.tmp"  # another machine's writer
    unnamed = tmp_path / ".cache.json.abc_56.tmp"  # written before names carried a pid
    old = tmp_path / ".cache.json.abc_78.tmp"
    other_target = tmp_path / ".other.json.abc_90.tmp"
    for tmp in (live, elsewhere, unnamed, old, other_target):
        tmp.write_text("{")
    hour_ago = time.time() - 3600
    for tmp in (old, other_target):
        os.utime(tmp, (hour_ago, hour_ago))
    records.write_json(path, {"n": 1})
    left = {p.name for p in tmp_path.glob("*.tmp")}
    assert left == {live.name, elsewhere.name, unnamed.name, other_target.name}


KILLED_SWEEP = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from pycuda_heads.tuning.constraints import Feasibility
from pycuda_heads.tuning.sweep import run_sweep
from test_tuning import Synthetic, toy_static, toy_task

class Killed(Synthetic):
    def time(self, params):
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no handler runs

task = toy_task()
run_sweep([task], evaluator_for=lambda t: Killed(), feasibility_for=lambda t: Feasibility(
    t, toy_static), out=Path(sys.argv[1]), mode="tpe", trials=5)
"""


def test_a_killed_sweep_stays_in_the_run_log(tmp_path):
    """The run is logged when it starts; killed before its end, it reads as killed."""
    from pycuda_heads.tuning.storage import read_runs, tuning_dir
    proc = subprocess.run([sys.executable, "-c", KILLED_SWEEP, str(tmp_path),
                           os.path.dirname(__file__)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    [run_] = read_runs(tuning_dir(tmp_path, toy_task().slug))
    assert run_["status"] == "killed" and run_["tasks"] == 1 and run_["tasks_done"] == 0
