"""CPU: the step benches' wall-time loop times its providers in turns and keeps a failing
provider's error without losing the others."""
from pycuda_heads.perf.step_bench import wall_us


def _provider(name, log, fail_after=None):
    calls = [0]

    def step():
        calls[0] += 1
        if fail_after is not None and calls[0] > fail_after:
            raise RuntimeError(f"{name} broke")
    return step, lambda: log.append(name)


def test_providers_take_turns_in_a_rotated_order():
    log = []
    got = wall_us({"a": _provider("a", log), "b": _provider("b", log),
                   "c": _provider("c", log)}, reps=3, target_s=0)
    timed = log[6:]  # after each provider's warm-up and calibration runs
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert list(got) == ["a", "b", "c"]
    assert all(r["reps"] == 3 and r["p20_us"] <= r["median_us"] <= r["p80_us"]
               for r in got.values())


def test_a_failing_provider_gets_an_error_and_the_others_go_on():
    log = []
    got = wall_us({"ok": _provider("ok", log), "bad": _provider("bad", log, fail_after=25)},
                  reps=4, target_s=0)
    assert got["bad"] == {"error": "RuntimeError: bad broke"}
    assert got["ok"]["reps"] == 4 and log.count("ok") == 2 + 4


def test_the_train_step_rows_time_the_library_step_in_turns(monkeypatch):
    from pycuda_heads.perf import train_bench

    class Step:
        def replay(self):
            pass

        def run(self):
            pass

        def synchronize(self):
            pass
    monkeypatch.setattr(train_bench, "model", lambda shape: ({}, {}))
    monkeypatch.setattr(train_bench, "library_step", lambda shape, params, data: Step())
    monkeypatch.setattr(train_bench, "kernel_sum_us", lambda step, reps: {"median_us": 1.0})
    monkeypatch.setattr(train_bench, "adam_rows", lambda *a: [])
    rows = train_bench.rows(lambda op, shape, pass_, provider, result: {
        "shape": shape, "provider": provider, **result}, None, 4000.0, 0, print)
    assert [r["provider"] for r in rows] == ["library_graph", "library_eager",
                                             train_bench.KERNEL_SUM] * len(train_bench.SHAPES)
    assert all("median_us" in r and "error" not in r for r in rows)


def test_the_run_summary_tells_a_failed_row_from_one_without_a_time():
    from pycuda_heads.perf.bench import summary
    base = {"op": "train_step_adam", "shape": "8 tensors", "pass": "step"}
    text = summary([{**base, "provider": "floor", "median_us": "",
                     "note": "L2-resident: 877716 B moved, L2 holds 62914560 B; no HBM floor"},
                    {**base, "provider": "torch_eager", "median_us": "", "error": "boom"},
                    {**base, "provider": "tuned", "median_us": "2.5"}])
    line = text.splitlines()[1].split()
    assert line[-5:] == ["2.5", "-", "error", "-", "L2-resident"]
