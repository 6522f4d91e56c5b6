"""One tuning worker process for the multi-process tests: ``tune`` of the toy task on the
synthetic evaluator, logging the start and end of every timing; ``--kill KIND:N`` makes it
SIGKILL itself at the N-th event of a kind (timing, journal lock held, exhaustive record)."""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import optuna  # noqa: E402
from pycuda_heads.tuning import locks  # noqa: E402
from pycuda_heads.tuning.constraints import Feasibility  # noqa: E402
from pycuda_heads.tuning.storage import open_storage, tuning_dir  # noqa: E402
from pycuda_heads.tuning.tune import tune  # noqa: E402
from test_tuning import Comparing, toy_static, toy_task  # noqa: E402

from pycuda_heads.tuning.spaces import point_key  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("log", type=Path)
p.add_argument("--mode", default="tpe")
p.add_argument("--trials", type=int, default=40)
p.add_argument("--seed", type=int, default=5)
p.add_argument("--storage", default=None)
p.add_argument("--kill", default="")
p.add_argument("--sleep", type=float, default=0.002)
p.add_argument("--host", default=None, help="pose as a worker on this machine")
args = p.parse_args()
kind, _, at = args.kill.partition(":")
seen: dict[str, int] = {}


def event(name: str) -> None:
    seen[name] = seen.get(name, 0) + 1
    if name == kind and seen[name] == int(at):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers


def log(line: str) -> None:
    with open(args.log, "a") as f:
        f.write(f"{os.getpid()} {line}\n")


class Logged(Comparing):
    def interleaved(self, a, b, **kw):
        log(f"compare {point_key(a)}")
        return super().interleaved(a, b, **kw)

    def time(self, params):
        log(f"start {point_key(params)}")
        event("timing")
        time.sleep(args.sleep)
        result = super().time(params)
        log(f"done {point_key(params)}")
        return result


acquire = locks.JournalLock.acquire


def held(self):
    acquire(self)
    event("journal")
    return True


locks.JournalLock.acquire = held
add_trial = optuna.Study.add_trial


def recording(self, trial):
    event("record")
    add_trial(self, trial)


optuna.Study.add_trial = recording
if args.host:
    from pycuda_heads.tuning import workers
    workers.HOST = args.host
task = toy_task()
storage = open_storage(args.storage, tuning_dir(args.out, task.slug), heartbeat_s=1, grace_s=3)
tune(task, Logged(), Feasibility(task, toy_static), out=args.out, mode=args.mode,
     trials=args.trials, seed=args.seed, storage=storage)
