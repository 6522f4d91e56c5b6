"""CPU: several tuning processes on one reports folder and study, and tuning processes killed
with SIGKILL anywhere, then resumed (synthetic evaluator, real processes, no GPU)."""
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
pytestmark = pytest.mark.installed  # workers run as new processes
from pycuda_heads.tuning.cache import Evaluation, TuningCache
from pycuda_heads.tuning.spaces import all_points, point_key
from test_tuning import Synthetic, by_key, infeasible_points, load, run, study_of, toy_task, TOY

from pycuda_heads import records

WORKER = Path(__file__).parent / "tuning_worker.py"
COUNTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def worker(out, log, *args):
    return subprocess.Popen([sys.executable, str(WORKER), str(out), str(log), *map(str, args)],
                            env=ENV, stderr=subprocess.PIPE, text=True)


def finish(*procs):
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err


def timings(log):
    """(started, done) timings as point keys, in log order."""
    lines = [line.split(" ", 2)[1:] for line in Path(log).read_text().splitlines()]
    return [k for what, k in lines if what == "start"], [k for what, k in lines if what == "done"]


def comparisons(log):
    """How many times a best was timed against the default."""
    return sum(line.split(" ", 2)[1] == "compare" for line in Path(log).read_text().splitlines())


def check_consistent(out, trials=None, storage=None):
    """No trial RUNNING, the requested count finished, every timing in the cache, the history
    equal to the finished trials and the default timed."""
    study = study_of(out) if storage is None else optuna.load_study(
        study_name=toy_task().study_name, storage=storage)
    finished = sorted((t for t in study.trials if t.state in COUNTED), key=lambda t: t.number)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    if trials is not None:
        assert len(finished) == trials
    data = load(out)
    assert [(h["trial"]) for h in data["history"]] == [t.number for t in finished]
    cached = by_key(data)
    assert all(point_key(t.params) in cached for t in finished)
    assert cached[point_key(TOY.default)]["time_us"] is not None
    return data


# --- concurrency -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode,storage", [("tpe", None), ("exhaustive", None),
                                          ("tpe", "sqlite")])
def test_two_concurrent_workers_share_one_study(tmp_path, mode, storage):
    log = tmp_path / "timed.log"
    # a fresh SQLite file: both workers create its schema at once
    url = ["--storage", f"sqlite:///{tmp_path / 'study.db'}"] if storage else []
    finish(worker(tmp_path, log, "--mode", mode, "--seed", 1, *url),
           worker(tmp_path, log, "--mode", mode, "--seed", 2, *url))
    started, done = timings(log)
    assert len(set(started)) == len(started)  # no configuration timed twice
    assert len({line.split()[0] for line in log.read_text().splitlines()}) == 2  # both worked
    assert comparisons(log) == 1  # the verdict against the default is reached once
    points = len(all_points(toy_task()))
    data = check_consistent(tmp_path, 40 if mode == "tpe" else points, url[1] if url else None)
    assert {point_key(e["params"]) for e in data["evaluations"] if e["time_us"] is not None} \
        == set(done)  # every timing in the cache
    if mode == "exhaustive":
        assert len(done) == points - len(infeasible_points())


def _write_many(path, n, seed):
    rng = random.Random(seed)
    for i in range(n):
        records.write_json(path, {"writer": seed, "i": i, "pad": "x" * rng.randrange(1, 50000)})


def test_concurrent_writers_never_show_a_reader_invalid_json(tmp_path):
    path = tmp_path / "shared.json"
    records.write_json(path, {"writer": -1})
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_write_many, args=(path, 150, s)) for s in range(4)]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers) or reads < 100:
        json.loads(path.read_text())  # raises on a torn or partial file
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


def _put_many(out, start):
    task = toy_task()
    cache = TuningCache.load(task, Path(out))
    for i, p in enumerate(all_points(toy_task())[start::4]):
        cache.put(Evaluation(p, "COMPLETE", time_us=1.0 + i, p20_us=1.0, p80_us=1.0))


def test_concurrent_cache_writers_keep_every_timing(tmp_path):
    path = tmp_path / "cache.json"
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_put_many, args=(path, s)) for s in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
        assert w.exitcode == 0
    cache = TuningCache.load(toy_task(), path)
    assert len(cache.evaluations) == len(all_points(toy_task()))


def test_a_lock_held_too_long_names_the_pid(tmp_path):
    from pycuda_heads.tuning.locks import FileLock, Locked
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pycuda_heads.tuning.locks import FileLock\n"
        f"l = FileLock({str(tmp_path / 'x.lock')!r}); l.acquire(); print('held', flush=True); "
        "time.sleep(60)")], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Locked, match=f"locked by pid {holder.pid}"):
            FileLock(tmp_path / "x.lock", wait_s=0.2).acquire()
    finally:
        holder.kill()
        holder.wait()
    with FileLock(tmp_path / "x.lock", wait_s=1):  # the dead holder's lock is gone
        pass


# --- SIGKILL and resume ----------------------------------------------------------------------

def kill_points(seed=14):
    """>= 20 kill points: in trial 0's timing, at random timings, while the journal lock is
    held, and while exhaustive results are being recorded."""
    rng = random.Random(seed)
    points = [("tpe", "timing:1"), ("tpe", "journal:1"), ("exhaustive", "record:3")]
    points += [("tpe", f"timing:{rng.randint(2, 12)}") for _ in range(8)]
    points += [("tpe", f"journal:{rng.randint(2, 400)}") for _ in range(6)]
    points += [("exhaustive", f"record:{rng.randint(1, 60)}") for _ in range(3)]
    points += [("exhaustive", f"timing:{rng.randint(1, 40)}") for _ in range(2)]
    return points


@pytest.mark.parametrize("mode,kill", kill_points(), ids=lambda v: str(v))
def test_resume_after_sigkill(tmp_path, mode, kill):
    log = tmp_path / "timed.log"
    if kill.startswith("record"):  # get to the recording with everything timed
        proc = worker(tmp_path, log, "--mode", mode, "--kill", "journal:100000")
        finish(proc)
        _drop_trials(tmp_path)
    first = worker(tmp_path, log, "--mode", mode, "--kill", kill)
    first.communicate(timeout=240)
    assert first.returncode == -signal.SIGKILL
    started = time.monotonic()
    finish(worker(tmp_path, log, "--mode", mode))
    assert time.monotonic() - started < 25  # no lock left behind to wait out
    finished = set()
    for line in log.read_text().splitlines():  # a finished timing is never started again
        _, what, key = line.split(" ", 2)
        assert not (what == "start" and key in finished), key
        if what == "done":
            finished.add(key)
    check_consistent(tmp_path, 40 if mode == "tpe" else len(all_points(toy_task())))


def _drop_trials(out):
    """A fresh journal (the caches stay): the next run records every result again."""
    (out / "toy-gpu" / "tuning" / records.JOURNAL).unlink()


def test_resume_after_sigkill_with_a_torn_journal_line(tmp_path):
    log = tmp_path / "timed.log"
    first = worker(tmp_path, log, "--kill", "timing:6")
    first.communicate(timeout=240)
    journal = tmp_path / "toy-gpu" / "tuning" / records.JOURNAL
    with open(journal, "ab") as f:
        f.write(b'{"op_code": 4, "worker_id": "x", "trial_id"')  # a write cut short
    finish(worker(tmp_path, log))
    check_consistent(tmp_path, 40)


def test_a_corrupt_journal_line_names_the_file_and_the_fix(tmp_path):
    run(tmp_path, Synthetic(), trials=5)
    journal = tmp_path / "toy-gpu" / "tuning" / records.JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    with pytest.raises(ValueError, match=rf"{journal} line 2 is corrupt; restore .* or delete"):
        run(tmp_path, Synthetic(), trials=5)


# --- NaN and inf -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_timing_is_a_failure_never_the_best(tmp_path, bad):
    from pycuda_heads.tuning.export import build_table
    from test_tuning import BEST_VALID, Comparing, toy_time
    broken = {**BEST_VALID, "VEC": 4}  # the fastest point
    ev = Comparing(fail=(), time_fn=lambda p: bad if p == broken else toy_time(p))
    out = run(tmp_path, ev, mode="exhaustive")
    rec = by_key(load(tmp_path))[point_key(broken)]
    assert rec["state"] == "ERROR" and rec["time_us"] is None and "non-finite" in rec["reason"]
    assert out.best.params == BEST_VALID
    [entry] = build_table(tmp_path, "toy-gpu")["entries"]
    assert entry["params"] == BEST_VALID and entry["time_us"] == toy_time(BEST_VALID)
    # reruns (tpe on the same study, exhaustive again) do not crash
    run(tmp_path, Comparing(fail=(), time_fn=lambda p: bad), mode="tpe", trials=60, seed=3)
    run(tmp_path, Synthetic(), mode="exhaustive")


def test_a_nan_in_an_old_cache_file_is_read_as_a_failure(tmp_path):
    run(tmp_path, Synthetic(), mode="tpe", trials=5)
    path = next((tmp_path / "toy-gpu" / "tuning").glob("toy.kernel__*.json"))
    data = json.loads(path.read_text())
    data["evaluations"][0].update(time_us=float("nan"), state="COMPLETE", validated=True)
    path.write_text(json.dumps(data))
    cache = TuningCache.load(toy_task(), path)
    assert cache.get(data["evaluations"][0]["params"]).state == "ERROR"
    run(tmp_path, Synthetic(), mode="tpe", trials=10)
