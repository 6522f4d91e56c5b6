"""The bench's CPU-side logic and the report generator, on stored fixture data (no GPU, no
PyCUDA, no torch; the torch peer checks run only where torch is installed)."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pycuda_heads import step
from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
from pycuda_heads.perf import bench
from pycuda_heads.records import FWD_BWD, dims_label
from pycuda_heads.report import build as report

FIXTURE = Path(__file__).parent / "fixtures" / "report"
# Drawing and reading the plots needs the report extra (matplotlib) and Pillow, which
# matplotlib brings.
needs_plots = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None or importlib.util.find_spec("PIL") is None,
    reason="plots need matplotlib: pip install -e '.[test]'")
NEWEST = "2026-11-20T10:15:02+00:00"  # the fixture's latest run; an older row must be ignored


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "reports")
    return tmp_path / "reports"


def fixture_times() -> dict[tuple[str, str, str, str], float]:
    with (FIXTURE / "nvidia-h200" / "bench.csv").open(newline="") as f:
        return {(r["op"], r["shape"], r["pass"], r["provider"]): float(r["median_us"])
                for r in csv.DictReader(f) if r["date"] == NEWEST and r["median_us"]}


def unanchored(text: str) -> str:
    """The report's Markdown without the ids its rows carry for links."""
    return re.sub(r'<a id="[^"]*"></a>', "", text)


def table_row(readme: str, *first_cells: str) -> list[str]:
    prefix = "| " + " | ".join(first_cells) + " |"
    lines = [line for line in unanchored(readme).splitlines() if line.startswith(prefix)]
    assert lines, f"no table row starting {prefix!r}"
    return [c.strip() for c in lines[0].strip().strip("|").split("|")]


def bench_case(op: str, pass_: str, shape: dict[str, int], cat=None):
    """The benchmark case of ``op``'s pass at ``shape``, as the catalog derives it."""
    found = [c for c in (cat or catalog()).bench_cases()
             if c.op == op and c.pass_ == pass_ and c.shape == shape]
    assert len(found) == 1, f"no single bench case {op} {pass_} {shape}"
    return found[0]


def floor_bytes(op: str, pass_: str, shape: dict[str, int], cat=None) -> int:
    return bench_case(op, pass_, shape, cat).floor_bytes()


# --- floor bytes -----------------------------------------------------------------------------

@pytest.mark.parametrize("op, pass_, shape, expected", [
    # q_h 5*128 + ln 4096*256*128 read; ctx 4096*5*128 + attn 4096*5*256 written
    ("pool", "forward", {"B": 4096, "K": 256}, 4 * (640 + 134217728 + 2621440 + 5242880)),
    # q_h, ln, attn, grad_ctx and the forward's ctx read; grad_q_h, grad_ln written
    ("pool", "backward", {"B": 4096, "K": 256},
     4 * (640 + 134217728 + 5242880 + 2621440 + 2621440 + 640 + 134217728)),
    ("pool", "fwd+bwd", {"B": 4096, "K": 256}, 568330752 + 1115689984),
    # ctx 65536*5*128, w_res 640, bias 5 read; residual 65536*5 written
    ("residual", "forward", {"B": 65536}, 4 * (41943040 + 640 + 5 + 327680)),
    # ctx, w_res, grad_residual read; grad_w_res, grad_bias_res, grad_ctx written
    ("residual", "backward", {"B": 65536}, 4 * (41943040 + 640 + 327680 + 640 + 5 + 41943040)),
    ("gate", "forward", {"B": 4096}, 4 * (20480 + 20480 + 5 + 20480)),
    # grad_head is grad_out itself: only grad_residual and grad_alpha are written
    ("gate", "backward", {"B": 4096}, 4 * (20480 + 5 + 20480 + 20480 + 5)),
    # logits 262144*5*21 + labels 262144*5 read, grad_logits + ce written
    ("frd", "fwd+bwd", {"B": 262144}, 4 * 2 * (27525120 + 1310720)),
])
def test_floor_bytes_by_hand(op: str, pass_: str, shape: dict[str, int], expected: int) -> None:
    assert floor_bytes(op, pass_, shape) == expected


def test_floor_matches_design_figures() -> None:
    # At the H200's ~4.3 TB/s copy bandwidth the pool (4096,256) fwd+bwd floor is ~390 us and
    # the FRD B=262144 floor ~54 us: the figures the kernels were planned against.
    assert floor_bytes("pool", "fwd+bwd", {"B": 4096, "K": 256}) / 4.3e6 == \
        pytest.approx(390, rel=0.01)
    assert floor_bytes("frd", "fwd+bwd", {"B": 262144}) / 4.3e6 == \
        pytest.approx(54, rel=0.01)


def test_fwd_bwd_floor_is_the_sum_of_its_kernels() -> None:
    case = bench_case("pool", FWD_BWD, {"B": 4096, "K": 256})
    assert [k.id for k in case.kernels] == ["pool.forward", "pool.backward"]
    spec = catalog()["pool.forward"]
    assert case.floor_bytes() == sum(
        k.floor_bytes(k.template(SUITE_TEMPLATE), case.shape) for k in case.kernels)
    assert spec.floor_bytes(spec.template(SUITE_TEMPLATE), case.shape) == 568330752


def test_passes_per_op_and_no_unknown_pass() -> None:
    def passes(op: str) -> tuple[str, ...]:
        mine = [c for c in catalog().bench_cases() if c.op == op]
        return tuple(c.pass_ for c in mine if c.shape == mine[0].shape)

    assert passes("pool") == ("forward", "backward", "fwd+bwd")
    assert passes("frd") == ("fwd+bwd",)
    assert not [c for c in catalog().bench_cases() if c.op == "frd" and c.pass_ == "forward"]
    # every suite shape of every family is benchmarked, each pass once
    keys = [(c.op, c.pass_, dims_label(c.label_dims)) for c in catalog().bench_cases()]
    assert len(keys) == len(set(keys))
    assert {(s.family, dims_label(shape)) for s in catalog() for shape in s.suite} == \
        {(op, shape) for op, _, shape in keys}


def test_inputs_are_random_non_zero_and_labels_hold_sentinels() -> None:
    x = catalog().family_inputs("frd", SUITE_TEMPLATE, {"B": 4096})
    assert x["labels"].dtype == np.int32
    assert x["labels"].min() == -1 and x["labels"].max() == 20
    assert 0.06 < (x["labels"] == -1).mean() < 0.14  # about one in ten is the sentinel
    assert np.all(x["logits"] != 0)
    pool = catalog().family_inputs("pool", SUITE_TEMPLATE, {"B": 3, "K": 5})
    assert set(pool) == {"q_h", "ln", "attn", "grad_ctx", "ctx"}
    np.testing.assert_allclose(pool["attn"].sum(axis=-1), 1, rtol=1e-5)
    # the backward's ctx is derived, the forward's of the drawn attn and ln
    np.testing.assert_allclose(pool["ctx"], pool["attn"] @ pool["ln"], rtol=1e-5, atol=1e-6)
    again = catalog().family_inputs("pool", SUITE_TEMPLATE, {"B": 3, "K": 5})
    assert all(np.array_equal(pool[n], again[n]) for n in pool)  # seeded


# --- imports ---------------------------------------------------------------------------------

def test_bench_and_report_import_without_torch_gpu_or_pyplot() -> None:
    code = ("import sys; import pycuda_heads.perf.bench, pycuda_heads.report.build; "
            "loaded = [m for m in ('torch', 'pycuda', 'matplotlib.pyplot') if m in sys.modules]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the bench's orchestration, on a fake GPU ------------------------------------------------

class FakeOp:
    """The float64 references behind the library's method names, one per kernel of a family;
    and a method another family declares as a fused kernel, whose kernels this family has, run
    as them in turn (FrdHeadSmall's ``backward``: its stages)."""

    def __init__(self, specs: Any) -> None:
        self.chosen = {}
        for spec in specs:
            setattr(self, spec.method, self._method(spec, (spec.role,)))
        roles = {s.role for s in specs}
        for spec in catalog():
            fused = tuple(catalog()[f].role for f in spec.fuses)
            if fused and spec.role not in roles and set(fused) <= roles \
                    and not hasattr(self, spec.method):
                setattr(self, spec.method, self._method(spec, fused))

    def _method(self, spec: Any, roles: tuple[str, ...]) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            for role in roles:
                self.chosen[role] = {"params": {"BLOCK": 128},
                                     "source": "default (no tuned table)"}
            return spec.reference(*args, dtype=np.float64)
        return call


class FakeHarness:
    torch_device = "cpu"
    slug = "fake-gpu"

    def env(self) -> dict[str, str]:
        return {"gpu": "Fake GPU", "driver_version": "1.0", "cuda_version": "13.0"}

    def upload(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(x)

    def library_op(self, specs: Any, provider: str, template: dict[str, int]) -> FakeOp:
        return FakeOp(specs)

    def sync(self) -> None:
        pass

    def empty_launch(self) -> Any:
        return lambda: None

    def copy_bandwidth_gbps(self) -> float:
        return 4000.0

    def time(self, fn: Any, reps: int) -> dict[str, float]:
        fn()
        return {"median_us": 10.0, "p20_us": 9.5, "p80_us": 10.5, "reps": reps,
                "python_call_us": 4.0}


def test_bench_run_on_a_fake_gpu_without_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.delitem(sys.modules, "pycuda_heads.perf.peers_torch", raising=False)
    small = {"gate": ({"B": 3}, {"B": 20}, {"B": 64}), "frd": ({"B": 16}, {"B": 64})}
    cat = catalog()
    cat = type(cat)(dataclasses.replace(s, suite=small.get(s.family, s.suite)) for s in cat)
    b = bench.Bench(FakeHarness(), ["gate", "frd"], quick=True, out_root=tmp_path,
                    commit="abc1234", cat=cat)
    assert [(op, shape) for op, shape, _ in b.plan()] == [
        ("gate", {"B": 3}), ("gate", {"B": 64}), ("frd", {"B": 16}), ("frd", {"B": 64})]
    with caplog.at_level(logging.INFO, "pycuda_heads"):
        path = b.run()
    assert path == tmp_path / "fake-gpu" / "bench.csv"
    # outside a terminal, a log line per case measured: the empty kernel, then each provider
    steps = [r.getMessage() for r in caplog.records if r.name == "pycuda_heads.progress"]
    assert len(steps) == 1 + 2 * 3 * 2 + 2 * 2
    assert steps[0] == "bench: 1/17 case (empty_kernel)"
    assert steps[-1] == "bench: 17/17 case (frd B=64 fwd+bwd default)"
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    # empty kernel + gate 2 shapes x 3 passes x 3 providers + frd 2 shapes x 1 pass x 3;
    # without torch no peer rows are written at all
    assert len(rows) == 1 + 2 * 3 * 3 + 2 * 3
    assert tuple(rows[0]) == bench.COLUMNS
    assert {r["commit"] for r in rows} == {"abc1234"} and {r["gpu"] for r in rows} == {"Fake GPU"}
    assert {r["torch_version"] for r in rows} == {"absent"}
    assert not [r for r in rows if r["provider"].startswith("torch")]
    assert {r["provider"] for r in rows} == {"empty_kernel", "floor", "tuned", "default"}
    for r in rows:
        if r["provider"] == "floor":
            fb = floor_bytes(r["op"], r["pass"], dict(parse_shape(r["shape"])), cat)
            assert int(r["floor_bytes"]) == fb
            assert float(r["median_us"]) == pytest.approx(fb / 4e6, rel=1e-5)
        else:
            assert float(r["median_us"]) == 10.0 and float(r["python_call_us"]) == 4.0
    tuned = [r for r in rows if r["provider"] == "tuned" and r["pass"] == "fwd+bwd"
             and r["op"] == "gate"][0]
    assert set(json.loads(tuned["config"])) == {"forward", "backward"}
    # the report reads what the bench wrote, and says the torch peers were not measured
    readme = report.build(tmp_path / "fake-gpu").read_text()
    assert "The torch peers were not measured: torch was not importable" in readme
    assert table_row(readme, "B=64", "fwd+bwd")[2] == "10.0*"  # the fake ran its defaults


def test_bench_runs_the_frd_head_as_the_compositions_do(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """At B <= SMALL_BATCH the frdhead rows time FrdHeadSmall's kernels (what TrainStep and the
    torch module run), and say so; above it FrdHead's own."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "pycuda_heads.perf.peers_torch", raising=False)
    families: list[str] = []

    class RecordingHarness(FakeHarness):
        def library_op(self, specs: Any, provider: str, template: dict[str, int]) -> FakeOp:
            families.append(specs[0].family)
            return super().library_op(specs, provider, template)

    small, large = {"B": step.SMALL_BATCH}, {"B": step.SMALL_BATCH + 1}
    cat = type(catalog())(dataclasses.replace(s, suite=(small, large))
                          if s.family == "frdhead" else s for s in catalog())
    b = bench.Bench(RecordingHarness(), ["frdhead"], quick=False, out_root=tmp_path,
                    commit="abc1234", cat=cat)
    with b.run().open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["provider"] in ("tuned", "default")]
    # per provider and batch; frd once, for the fused pass's separate ops
    assert families == ["frdsmall", "frdsmall", "frd", "frdhead", "frdhead"]
    assert {r["op"] for r in rows} == {"frdhead"}
    for r in rows:
        routed = r["shape"] == f"B={step.SMALL_BATCH}"
        assert (r["note"] == "runs frdsmall's kernels, as the library's compositions do at "
                "this batch") == routed and (r["note"] == "") == (not routed)
    readme = report.build(tmp_path / "fake-gpu").read_text()
    assert table_row(readme, f"B={step.SMALL_BATCH}", "fwd+bwd")[2].endswith("\u2020")
    assert not table_row(readme, f"B={step.SMALL_BATCH + 1}", "fwd+bwd")[2].endswith("\u2020")
    assert (f"\u2020 runs frdsmall's kernels, as the library's compositions do at this batch "
            f"(B={step.SMALL_BATCH}), in the tuned and default columns alike.") in readme


def parse_shape(text: str) -> list[tuple[str, int]]:
    return [(k, int(v)) for k, v in (p.split("=") for p in text.split(","))]


def test_measure_leaves_the_warm_up_to_the_timing(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    class CountingHarness(FakeHarness):
        def time(self, fn: Any, reps: int) -> dict[str, float]:
            calls.append("time")
            return super().time(fn, reps)

    b = object.__new__(bench.Bench)
    b.harness, b.reps = CountingHarness(), 5
    result = b._measure(lambda: calls.append("call"), "fake op")
    assert calls == ["time", "call"]  # no call of fn of its own before the timing's
    assert result["median_us"] == 10.0 and result["noisy"] == 0

    def broken() -> None:
        raise RuntimeError("launch failed")
    assert b._measure(broken, "broken op") == {"error": "RuntimeError: launch failed"}
    assert "broken op failed: RuntimeError: launch failed" in caplog.text


def test_append_rows_rewrites_an_older_header(tmp_path: Path) -> None:
    path = tmp_path / "bench.csv"
    path.write_text("date,op,median_us\n2026-01-01T00:00:00+00:00,pool,12.5\n")
    bench.append_rows(path, [{"date": "2026-02-01T00:00:00+00:00", "op": "frd",
                              "median_us": 3.25}])
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == bench.COLUMNS
    assert [(r["op"], r["median_us"]) for r in rows] == [("pool", "12.5"), ("frd", "3.25")]


# --- the report ------------------------------------------------------------------------------

def test_report_tables_hold_the_fixture_numbers(reports: Path) -> None:
    readme = report.build(reports / "nvidia-h200").read_text()
    t = fixture_times()
    key = ("pool", "B=4096,K=256", "fwd+bwd")
    tuned, eager, compiled = (t[(*key, p)] for p in ("tuned", "torch_eager", "torch_compile"))
    floor, default = t[(*key, "floor")], t[(*key, "default")]
    cells = table_row(readme, "B=4096,K=256", "fwd+bwd")
    assert cells[2] == "512"                      # the latest run's tuned time, not the older 999
    assert cells[4:7] == ["612", "3945", "1600"]
    assert cells[8] == f"{100 * floor / tuned:.0f}%"
    assert cells[9] == f"{eager / tuned:.2f}x" == "7.71x"
    assert cells[10] == f"{compiled / tuned:.2f}x" == "3.12x"
    assert cells[11] == f"{default / tuned:.2f}x"
    assert "999" not in " ".join(cells)


def test_changes_since_the_previous_run_name_regressions_beyond_their_noise(
        reports: Path) -> None:
    """The fixture's older run timed pool B=4096,K=256 fwd+bwd at 999 us (now 512: faster);
    an older run added here, its empty launch 2.35 us against 2.40 now, timed the B=2,K=8
    backward at 6.0 us (now 6.9, +15%: beyond its band of 12%, 5% + 2% launch drift + 4% spread: a
    regression), the fwd+bwd at 9.5 (now 10.2, +7%: within its band of 12%) and the forward at
    3.05 (now 3.1: within)."""
    bench_csv = reports / "nvidia-h200" / "bench.csv"
    with bench_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    old = "2026-11-18T09:00:00+00:00"
    template = next(r for r in rows if r["date"] == NEWEST and r["op"] == "pool"
                    and r["shape"] == "B=2,K=8" and r["pass"] == "backward"
                    and r["provider"] == "tuned")
    empty = next(r for r in rows if r["date"] == NEWEST and r["provider"] == "empty_kernel")
    rows += [{**template, "date": old, "commit": "beef000", "median_us": "6.0"},
             {**template, "date": old, "commit": "beef000", "pass": "forward", "median_us": "3.05"},
             {**template, "date": old, "commit": "beef000", "pass": "fwd+bwd", "median_us": "9.5",
              "p20_us": "9.4", "p80_us": "9.6"},
             {**empty, "date": old, "commit": "beef000", "median_us": "2.35"}]
    with bench_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "## Changes since the previous run" in readme
    assert ("Within it: 2 of 4 cases; slower beyond it (regressions): 1; faster beyond it: 1."
            in readme)
    slower = table_row(readme, "pool", "B=2,K=8", "backward", "6.00", "beef000", "6.90")
    assert slower[6:] == ["+15%", "±12%", "2.35 / 2.40", "**regression**"]
    faster = table_row(readme, "pool", "B=4096,K=256", "fwd+bwd", "999", "0ff1ce0", "512")
    assert faster[6] == "-49%" and faster[-1] == "faster"
    assert not [line for line in readme.splitlines()
                if line.startswith("| pool | B=2,K=8 | forward | 3.05")
                or line.startswith("| pool | B=2,K=8 | fwd+bwd | 9.50")]


def test_report_targets_say_met_or_missed_and_by_how_much(reports: Path) -> None:
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "5 of 8 measured targets met" in readme
    pool_compile = table_row(readme, "pool", "B=4096,K=256", "fwd+bwd", "512", "3.12x")
    assert pool_compile[-1].startswith("**missed**") and f"needs {5 / 3.125:.2f}x faster" in \
        pool_compile[-1]
    frd_floor = table_row(readme, "frd", "B=262144", "fwd+bwd", "62.0", "86%")
    assert frd_floor[-1] == "met: reaches 86% of the floor"
    # smallest pool backward: 6.9 us against a 2.4 us empty launch
    small = table_row(readme, "pool", "B=2,K=8", "backward")
    assert small[4] == "2.88x" and small[-1].startswith("**missed**")


def test_report_lists_failures_defaults_tuning_and_validation(reports: Path) -> None:
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "torch.compile failed at B=1024 fwd+bwd: `BackendCompilerFailed" in readme
    assert table_row(readme, "B=1024", "fwd+bwd")[2] == "2.90*"  # no tuned entry applied
    tuning = table_row(readme, "pool.forward", "HIDDEN_DIM=128,N_HORIZONS=5", "B=4096,K=256")
    assert tuning[3:6] == ["190", "165", "1.15x"] and tuning[-1] == "BLOCK"
    efficiency = table_row(readme, "frd.softmax_ce_grad", "B=262144", "61")
    assert efficiency[5:] == ["17", "14, never, 17"]
    row = table_row(readme, "frd.softmax_ce_grad", "2", "1", "1")
    assert row[4] == "4.0e-02" and row[6] == "no"  # the fixture record predates per-family runs
    assert "failed: frd.softmax_ce_grad tuned" in readme
    assert "HIDDEN_DIM=128,N_ATOMS=21,B=262144: extreme_logits" in readme


def test_without_matplotlib_the_report_has_its_tables_and_says_why_no_plots(
        reports: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pycuda_heads.report import plots
    monkeypatch.setattr(plots, "available", lambda: False)
    gpu_dir = reports / "nvidia-h200"
    readme = report.build(gpu_dir).read_text()
    assert "Plots are not drawn: matplotlib is missing" in readme
    assert table_row(readme, "B=4096,K=256", "fwd+bwd")[2] == "512" and ".png" not in readme
    assert not list(gpu_dir.glob("*.png"))


@needs_plots
def test_report_plots_are_valid_pngs(reports: Path) -> None:
    from PIL import Image
    gpu_dir = reports / "nvidia-h200"
    readme = report.build(gpu_dir).read_text()
    names = ["pool_time.png", "pool_floor.png", "frd_time.png", "frd_floor.png",
             "tuning_pool-forward-hidden-dim-128-n-horizons-5-b-4096-k-256.png"]
    for name in names:
        assert f"]({name})" in readme
        with Image.open(gpu_dir / name) as img:
            assert img.format == "PNG" and img.width > 300 and img.height > 200
            img.verify()


def _case(rows: dict[str, dict[str, Any]]):
    from pycuda_heads.report.data import BenchResult
    return BenchResult("gate", "B=3", "forward", rows)


def _row(us: float, p20: float | None = None, p80: float | None = None, **extra: Any) -> dict:
    return {"median_us": us, "p20_us": p20 or us, "p80_us": p80 or us, **extra}


def test_speedups_below_one_read_slower() -> None:
    from pycuda_heads.report import data, tables
    assert tables.speedup(2.5) == "2.50x" and tables.speedup(0.25) == "4.00x slower"
    case = _case({"tuned": _row(4.0), "torch_compile": _row(1.0)})
    target = data._compile_target(case)
    assert target.detail.startswith("4.00x slower than torch.compile") and "0.25x" not in \
        target.detail
    section = tables.op_section("gate", [case], [])
    assert "4.00x slower" in table_row(section, "B=3", "forward")[10]


def test_a_pass_whose_data_sits_in_l2_gets_no_share_of_the_dram_floor() -> None:
    from pycuda_heads.report import data, tables
    fits = _case({"tuned": _row(4.0, l2_cache_bytes=50 << 20),
                  "floor": _row(1.0, floor_bytes=1 << 20)})
    beats = _case({"tuned": _row(6.1), "floor": _row(7.0, floor_bytes=1 << 30)})
    dram = _case({"tuned": _row(4.0, l2_cache_bytes=50 << 20),
                  "floor": _row(2.0, floor_bytes=1 << 30)})
    assert fits.l2_resident and beats.l2_resident and not dram.l2_resident
    assert fits.floor_fraction is None and dram.floor_fraction == 0.5
    assert [tables.floor_cell(c) for c in (fits, beats, dram)] == ["in L2", "in L2", "50%"]
    target = data._floor_target(beats)
    assert target.met is None and "fits in L2" in target.detail
    section = tables.op_section("gate", [beats], [])
    assert table_row(section, "B=3", "forward")[8] == "in L2"


def test_noisy_cells_are_marked_and_same_launch_is_not_a_ratio() -> None:
    from pycuda_heads.report import tables
    config = json.dumps({"forward": {"params": {"BLOCK": 256}, "source": "x"}})
    case = _case({"tuned": _row(2.0, 1.0, 2.0, config=config),
                  "default": _row(1.8, noisy="1", config=config)})
    section = tables.op_section("gate", [case], [])
    cells = table_row(section, "B=3", "forward")
    assert cells[2] == "2.00 ~" and cells[4] == "1.80 ~"
    assert cells[11] == "same launch"
    assert "~ noisy: the p80/p20 spread stayed above 1.5" in section
    other = json.dumps({"forward": {"params": {"BLOCK": 128}, "source": "tuned"}})
    case = _case({"tuned": _row(2.0, config=other), "default": _row(2.2, config=config)})
    assert table_row(tables.op_section("gate", [case], []), "B=3", "forward")[11] == "1.10x"
    assert "~ noisy" not in tables.op_section("gate", [case], [])


def test_an_incomplete_sweep_is_stated_with_what_is_missing(reports: Path) -> None:
    runs = [{"command": "pycuda-heads sweep", "started": "2026-11-20T09:00:00+00:00",
             "wall_s": 30.0, "tasks": 28, "tasks_done": 28, "unfinished": False, "missing": []},
            {"command": "pycuda-heads sweep --time-budget 60", "wall_s": 61.0,
             "started": "2026-11-20T10:00:00+00:00", "tasks": 28, "tasks_done": 26,
             "unfinished": True, "missing": ["frd.softmax_ce_grad B=1024", "gate.forward B=3"]},
            {"command": "pycuda-heads tune --kernel gate.forward", "tasks": 1, "tasks_done": 1}]
    (reports / "nvidia-h200" / "tuning" / "runs.json").write_text(json.dumps(runs))
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "26 of 28 kernel x shape tasks finished" in readme
    assert ("**The sweep is incomplete.** Not tuned: frd.softmax_ce_grad B=1024, "
            "gate.forward B=3.") in readme
    (reports / "nvidia-h200" / "tuning" / "runs.json").write_text(json.dumps(runs[:1]))
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "28 of 28 kernel x shape tasks finished" in readme and "incomplete" not in readme


def test_a_multi_worker_sweep_shows_each_worker_and_configurations_timed_twice(
        reports: Path) -> None:
    command = "pycuda-heads sweep --workers 2 --trials 12"
    task_a, task_b = "gate.forward__N_HORIZONS=5__B=3", "gate.forward__N_HORIZONS=5__B=64"
    key = {i: json.dumps({"BLOCK": 32 * i}) for i in range(1, 6)}

    def worker(i: int, wall_s: float, trials: int, timed_points: dict[str, list[str]]) -> dict:
        return {"command": command, "started": "2026-11-20T11:00:00+00:00", "wall_s": wall_s,
                "run_id": "2026-11-20T11:00:00+00:00/4242", "workers": 2, "worker": i,
                "cuda_visible_devices": str(i), "mode": "tpe", "seed": i, "tasks": 2,
                "tasks_done": 2, "trials_per_task": 12, "trials": trials,
                "timed": sum(map(len, timed_points.values())), "timed_points": timed_points,
                "unfinished": False, "missing": []}

    plain = {"command": "pycuda-heads sweep", "started": "2026-11-20T09:00:00+00:00",
             "wall_s": 30.0, "tasks": 2, "tasks_done": 2, "unfinished": False, "missing": []}
    runs_json = reports / "nvidia-h200" / "tuning" / "runs.json"
    runs = [plain, worker(1, 41.5, 11, {task_a: [key[3]], task_b: [key[4], key[5]]}),
            worker(0, 40.0, 13, {task_a: [key[1], key[2]], task_b: [key[1]]})]
    runs_json.write_text(json.dumps(runs))
    readme = report.build(reports / "nvidia-h200").read_text()
    section = readme.split("## Multi-worker sweeps", 1)[1].split("\n## ", 1)[0]
    assert (f"Run `2026-11-20T11:00:00+00:00/4242`: `{command}`, 2 workers on GPUs 0, 1, "
            "wall time 41.5 s.") in section
    assert table_row(section, "0") == ["0", "0", "0", "2 of 2", "13", "3"]
    assert table_row(section, "1") == ["1", "1", "1", "2 of 2", "11", "3"]
    assert "- trials, all workers: 24 of 24 (2 tasks x 12 trials)" in section
    assert "- configurations timed by more than one worker: 0\n" in section
    # the same configuration of the same task timed by both workers is counted once
    runs[1]["timed_points"][task_b].append(key[1])
    runs[2]["timed_points"][task_a].append(key[3])
    runs_json.write_text(json.dumps(runs[:2]))  # worker 0 never logged
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "**only 1 of 2 workers logged their run**" in readme
    assert "- configurations timed by more than one worker: 0\n" in readme
    runs_json.write_text(json.dumps(runs))
    readme = report.build(reports / "nvidia-h200").read_text()
    assert "- configurations timed by more than one worker: **2** (each should be timed " \
        "once)" in readme
    runs_json.write_text(json.dumps([plain]))  # no multi-worker run: no section
    assert "Multi-worker" not in report.build(reports / "nvidia-h200").read_text()


@needs_plots
def test_no_empty_plot_and_no_stale_plot(reports: Path) -> None:
    gpu_dir = reports / "nvidia-h200"
    (gpu_dir / "tuning_gone.png").write_bytes(b"old")
    bare = {"kernel": "gate.forward", "template": {"N_HORIZONS": 5}, "shape": {"B": 7}}
    (gpu_dir / "tuning" / "gate.forward__N_HORIZONS=5__B=7.json").write_text(json.dumps(bare))
    report.build(gpu_dir)
    assert not (gpu_dir / "tuning_gone.png").exists()
    assert not list(gpu_dir.glob("tuning_gate-forward*b-7.png"))
    # an op whose every provider failed gets its table, and no plot
    from pycuda_heads.report import plots
    case = _case({"tuned": {"error": "LaunchError: x"}, "floor": _row(1.0)})
    assert not plots.op_times("gate", "NVIDIA H200", [case], 1.0, gpu_dir / "x.png")
    assert not plots.op_floor("gate", "NVIDIA H200", [case], gpu_dir / "y.png")
    assert not list(gpu_dir.glob("[xy].png"))


@needs_plots
def test_time_plot_axis_spans_the_times_not_the_floor(reports: Path, monkeypatch) -> None:
    from matplotlib.figure import Figure

    from pycuda_heads.report import plots
    seen: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: seen.append(self))
    case = _case({"tuned": _row(2.0), "default": _row(2.0), "floor": _row(1e-5)})
    assert plots.op_times("gate", "NVIDIA H200", [case], 1.4, reports / "t.png")
    ax = seen[0].axes[0]
    assert ax.get_ylim()[0] == pytest.approx(1.0)  # half the fastest time, not the 1e-5 floor
    assert "NVIDIA H200" in seen[0].get_suptitle()
    lines = {line.get_label(): line for line in ax.get_lines()}
    # both visible: default wide and hollow underneath; markers only, no line across shapes
    assert lines["default"].get_markersize() > lines["tuned"].get_markersize()
    assert lines["tuned"].get_zorder() > lines["default"].get_zorder()
    assert {line.get_linestyle() for line in lines.values()
            if line.get_label() in ("tuned", "default", "floor")} == {"None"}
    assert seen[0].legends and not ax.get_legend()  # under the panels, not over the data


def test_head_step_section_compares_the_graph_with_torch() -> None:
    from pycuda_heads.report import data, tables
    times = {"library_eager": 60.0, "library_graph": 20.0, "torch_eager": 1500.0,
             "torch_compile": 1200.0, "torch_compile_ro": 150.0}
    rows = [{"op": "step", "shape": "B=2,K=8", "pass": "fwd+bwd", "provider": p,
             "median_us": v} for p, v in times.items()]
    rows.append({"op": "step", "shape": "B=256,K=64", "pass": "fwd+bwd",
                 "provider": "library_graph", "error": "RuntimeError: x"})
    section = tables.step(data.step_results(rows))
    cells = table_row(section, "B=2,K=8")
    assert cells[1:6] == ["60.0", "20.0", "1500", "1200", "150"]
    assert cells[6:] == ["75.00x", "7.50x"]
    assert "**missed**: 7.50x faster" in table_row(section, "B=2,K=8",
                                                   "graph vs torch.compile reduce-overhead")[-1]
    assert table_row(section, "B=2,K=8", "graph vs torch eager")[-1] == "met: 75.00x faster"
    assert "failed: library, CUDA graph at B=256,K=64: `RuntimeError: x`" in section
    assert [c.op for c in data.cases(rows)] == []  # not mixed into the kernel ops' sections


def test_torch_train_section_states_each_goal() -> None:
    from pycuda_heads.report import data, tables
    times = {"pool B=4096,K=256": {"library_eager": 500.0, "library_compile": 480.0,
                                   "library_compile_ro": 450.0, "torch_eager": 4400.0,
                                   "torch_compile": 900.0, "torch_compile_ro": 800.0},
             "pool B=2,K=8": {"library_eager": 300.0, "library_compile": 350.0,
                              "library_compile_ro": 90.0, "torch_eager": 250.0,
                              "torch_compile": 400.0, "torch_compile_ro": 80.0}}
    rows = [{"op": "torch_train", "shape": shape, "pass": "fwd+bwd", "provider": p,
             "median_us": v} for shape, by in times.items() for p, v in by.items()]
    rows.append({"op": "torch_train", "shape": "frd B=256", "pass": "fwd+bwd",
                 "provider": "torch_compile", "error": "RuntimeError: y"})
    section = tables.torch_train(data.train_results(rows))
    # frd first, then pool by size
    order = [line.split("|")[1].strip() for line in unanchored(section).splitlines()
             if line.startswith("| frd") or line.startswith("| pool")]
    assert order[:3] == ["frd B=256", "pool B=2,K=8", "pool B=4096,K=256"]
    assert table_row(section, "pool B=4096,K=256")[1:7] == ["500", "480", "450", "4400", "900",
                                                              "800"]
    big = lambda what: table_row(section, "pool B=4096,K=256", what)[-1]  # noqa: E731
    assert big("library reduce-overhead vs torch reduce-overhead").startswith("met: 1.78x")
    assert big("library eager vs torch compiled") == "**missed**: 1.80x faster"
    small = lambda what: table_row(section, "pool B=2,K=8", what)[-1]  # noqa: E731
    assert small("library eager vs torch eager").startswith("**missed**")
    assert small("library reduce-overhead vs torch reduce-overhead").startswith("**missed**")
    assert "failed: torch compiled at frd B=256: `RuntimeError: y`" in section
    assert [c.op for c in data.cases(rows)] == []


def test_the_largest_shape_is_the_suite_models_not_a_wide_head() -> None:
    from pycuda_heads.report import data
    cases = [data.BenchResult("pool", shape, "fwd+bwd", {"tuned": _row(1.0)})
             for shape in ("B=2,K=8", "B=4096,K=256", "B=1024,HIDDEN_DIM=512,K=128,N_HORIZONS=8")]
    assert [c.shape for c in data.extreme_cases(cases, "pool", largest=True)] == ["B=4096,K=256"]
    assert [c.shape for c in data.extreme_cases(cases, "pool", largest=False)] == ["B=2,K=8"]


def test_a_torn_bench_line_is_named_and_left_out(reports: Path) -> None:
    bench_csv = reports / "nvidia-h200" / "bench.csv"
    lines = bench_csv.read_text().count("\n")
    with bench_csv.open("a") as f:
        f.write("2026-11-30T00:00:00+00:00,abc,NVIDIA H2\n")  # a write cut short
    readme = report.build(reports / "nvidia-h200").read_text()
    assert f"`bench.csv`: malformed line(s) {lines + 1} left out" in readme


def test_caches_tuned_for_other_sources_are_flagged_stale(tmp_path: Path) -> None:
    from pycuda_heads.report import data, tables
    d = data.ReportData(tmp_path)
    d.validation = {"variants": [{"kernel": "gate.forward", "source_hash": "now"}]}
    cache = {"kernel": "gate.forward", "template": {"N_HORIZONS": 5}, "shape": {"B": 3},
             "default_time_us": 2.0, "best": {"time_us": 1.0, "params": {"BLOCK": 64}}}
    d.tuning = [{**cache, "source_hash": "old"},
                {**cache, "shape": {"B": 4096}, "source_hash": "now"}]
    d.efficiency = [{"kernel": "gate.forward", "shape": {"B": 3}, "n_points": 9},
                    {"kernel": "gate.forward", "shape": {"B": 4096}, "n_points": 9}]
    section = tables.tuning(d, {})
    assert table_row(section, "gate.forward (**stale**)", "N_HORIZONS=5", "B=3")
    assert table_row(section, "gate.forward", "N_HORIZONS=5", "B=4096")
    section = tables.efficiency(d)
    assert table_row(section, "gate.forward (**stale**)", "B=3")
    assert table_row(section, "gate.forward", "B=4096")


def test_report_cli_writes_every_gpu_and_the_index(reports: Path) -> None:
    parser = argparse.ArgumentParser()
    report.register(parser.add_subparsers())
    args = parser.parse_args(["report", "--out", str(reports)])
    assert args.func(args) == 0
    index = (reports / "README.md").read_text()
    assert "[nvidia-h200/README.md](nvidia-h200/README.md)" in index
    assert table_row(index, "NVIDIA H200")[1:3] == [NEWEST, "1a2b3c4"]
    assert (reports / "nvidia-h200" / "README.md").is_file()


def test_missing_inputs_are_named_not_fatal(tmp_path: Path) -> None:
    readme = report.build(tmp_path / "nvidia-h200").read_text()
    for what in ("benchmark results", "tuning caches", "tuner efficiency table",
                 "GPU validation record"):
        assert f"**missing**: {what}" in readme
    assert not list((tmp_path / "nvidia-h200").glob("*.png"))
    index = report.build_index(tmp_path / "empty").read_text()
    assert "No GPU has data yet" in index


def test_bench_alone_gives_tables_and_names_the_rest(tmp_path: Path) -> None:
    gpu_dir = tmp_path / "nvidia-h200"
    gpu_dir.mkdir()
    shutil.copy(FIXTURE / "nvidia-h200" / "bench.csv", gpu_dir)
    (gpu_dir / "validation.json").write_text("{not json")
    readme = report.build(gpu_dir).read_text()
    assert table_row(readme, "B=4096,K=256", "fwd+bwd")[2] == "512"
    assert "**missing**: tuning caches" in readme
    assert "**unreadable**: `validation.json` could not be read" in readme
    assert "## Validation" not in readme and "## Tuning" not in readme


# --- the torch peers (only where torch is installed; CPU) ------------------------------------

PEER_SHAPES = {"pool": {"B": 3, "K": 7}, "residual": {"B": 5}, "gate": {"B": 6}, "frd": {"B": 40},
               "reduce": {"N": 33, "M": 7}, "resgate": {"B": 5}, "frdhead": {"B": 9},
               "adam": {"N": 50}, "multiadam": {"N": 50}, "headloss": {"B": 7, "L": 1}}


def test_every_benchmarked_kernel_declares_a_torch_peer() -> None:
    ops = {c.op for c in catalog().bench_cases()}
    assert [s.id for s in catalog() if s.family in ops and s.peer is None] == []


@pytest.mark.parametrize("kernel", sorted(s.id for s in catalog() if s.peer is not None))
def test_torch_peers_match_the_float64_reference(kernel: str) -> None:
    pytest.importorskip("torch")
    from pycuda_heads.perf import peers_torch
    spec = catalog()[kernel]
    op = spec.family
    shape = PEER_SHAPES.get(op, spec.suite[0])  # a family without an entry: its first suite shape
    x = spec.make_inputs(spec.template(SUITE_TEMPLATE), shape, seed=3)
    if op == "frd":
        x["logits"][0, 0, :] = np.linspace(-1e4, 1e4, x["logits"].shape[-1])  # extreme row
        x["labels"][0, 0], x["labels"][1, :] = 0, -1  # p[label] underflows; a sentinel row
    want = spec.run_reference(x)
    t = peers_torch.to_torch(x, "cpu")
    got = peers_torch.call(spec, t, compiled=False)()
    got = got if isinstance(got, tuple) else (got,)
    assert peers_torch.max_rel_err(want, got) < 1e-5
    if op == "frd":
        assert float(got[1][0, 0]) == pytest.approx(-np.log(1e-30), rel=1e-6)
        assert not got[0][1].any() and not got[1][1].any()


def test_the_tf32_product_counts_its_flops_and_leaves_the_peers_in_float32() -> None:
    torch = pytest.importorskip("torch")
    from pycuda_heads.perf import peers_torch
    peers_torch.prepare("cpu")
    product, flops = peers_torch.tf32_product("cpu")
    product()
    assert flops == 2 * 256 ** 3
    assert torch.backends.cuda.matmul.allow_tf32 is False  # as prepare set it, after the call


# --- the smoke training section ----------------------------------------------------------------

SMOKE_FIXTURE = Path(__file__).parent / "fixtures" / "smoke_training.json"


@needs_plots
def test_smoke_section_states_each_field_and_draws_the_loss_curve(reports: Path) -> None:
    from PIL import Image
    gpu_dir = reports / "nvidia-h200"
    shutil.copy(SMOKE_FIXTURE, gpu_dir / "smoke_training.json")
    readme = report.build(gpu_dir).read_text()
    assert "## Smoke training" in readme and "](smoke_loss.png)" in readme
    record = json.loads(SMOKE_FIXTURE.read_text())
    assert table_row(readme, "loss_first / loss_last")[1:] == [
        f"{record['loss_first']:.4g} / {record['loss_last']:.4g}", "met"]
    for field in ("nan", "bitwise_rerun", "graph_eager_bitwise", "reference_match"):
        assert table_row(readme, field)[-1] == "met"
    assert "largest relative loss difference 2.1e-07" in readme
    with Image.open(gpu_dir / "smoke_loss.png") as img:
        assert img.format == "PNG" and img.width > 300
    record.update(bitwise_rerun=False, loss_last=record["loss_first"] * 0.9, losses=[])
    (gpu_dir / "smoke_training.json").write_text(json.dumps(record))
    readme = report.build(gpu_dir).read_text()
    assert table_row(readme, "bitwise_rerun")[-1] == "**missed**"
    assert "did not halve" in table_row(readme, "loss_first / loss_last")[-1]
    assert "smoke_loss.png" not in readme and not (gpu_dir / "smoke_loss.png").exists()


def test_phase_table_totals_complete_runs_and_lists_narrowed_ones() -> None:
    from pycuda_heads.report import tables
    log = [{"phase": "sweep", "status": 0, "started": "t0", "seconds": 300.0},
           {"phase": "bench", "status": 0, "started": "t1", "seconds": 200.0},
           {"phase": "sweep", "status": 0, "started": "t2", "seconds": 40.0,
            "subset": "kernels pool.forward"}]
    text = tables.phases(log)
    assert "Total: 8.3 minutes." in text  # 300 + 200 s: the narrowed sweep is not a main job
    assert "| sweep | t0 | 300 | ok |" in text
    assert "Narrowed runs since, not in the total: sweep (kernels pool.forward, t2, 40 s)" in text
    # a complete run after a narrowed one supersedes it
    text = tables.phases(log + [{"phase": "sweep", "status": 0, "started": "t3", "seconds": 290.0}])
    assert "Narrowed" not in text and "| sweep | t3 | 290 | ok |" in text


def test_log_phase_records_a_narrowed_run(tmp_path) -> None:
    import time
    from pycuda_heads import records
    records.log_phase(tmp_path, "bench", time.time(), 0, "ops pool")
    records.log_phase(tmp_path, "bench", time.time(), 0)
    logged = records.read_json(tmp_path / records.PHASES_JSON, "phase log")
    assert logged[0]["subset"] == "ops pool" and "subset" not in logged[1]


def test_report_twice_gives_the_same_bytes_and_leaves_its_data_alone(tmp_path) -> None:
    """The shipped reports, regenerated twice: identical files, and every data file it reads
    (bench rows, records, tuning data, the phase log) byte for byte as before."""
    import filecmp
    import shutil

    from pycuda_heads.cli import main
    root = Path(__file__).resolve().parents[1] / "reports"
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(root, first)
    data = {p.relative_to(first): p.read_bytes() for p in first.rglob("*")
            if p.is_file() and p.suffix in (".csv", ".json", ".journal")}
    assert main(["report", "--out", str(first)]) == 0
    shutil.copytree(first, second)
    assert main(["report", "--out", str(second)]) == 0
    for rel, before in data.items():
        assert (first / rel).read_bytes() == before, f"report changed {rel}"
    mismatch = filecmp.dircmp(first, second)
    changed = [f for d in [mismatch, *mismatch.subdirs.values()] for f in d.diff_files]
    assert not changed, f"a second report differs in {changed}"
    for readme in root.glob("*/README.md"):  # what ships is what the code makes of the data
        made = (first / readme.relative_to(root)).read_text()
        if importlib.util.find_spec("matplotlib") is not None:  # else a note replaces plots
            assert made == readme.read_text(), f"{readme} is stale: run pycuda-heads report"
        assert not [p for p in re.findall(r"(\d+(?:\.\d+)?)%", made) if float(p) > 100]
        assert not [x for x in re.findall(r"(\d+(?:\.\d+)?)x faster", made) if float(x) < 1]


def test_the_whole_training_step_table_and_its_goals():
    from pycuda_heads.report import data as report_data, tables as report_tables
    rows = []
    for shape, graph, ro, kernels in (("B=2,K=8", 21.0, 700.0, 12.0),
                                      ("B=4096,K=256", 400.0, 3000.0, 380.0)):
        for provider, t in (("library_graph", graph), ("torch_compile_ro", ro),
                            ("kernel_sum", kernels)):
            rows.append({"op": "train_step", "shape": shape, "pass": "fwd+bwd",
                         "provider": provider, "median_us": t})
    adam = {"op": "train_step_adam", "shape": "8 tensors,N=31347", "pass": "step"}
    rows += [{**adam, "provider": "library_multi", "median_us": 2.5},
             {**adam, "provider": "floor", "note": "L2-resident: 877716 B moved"}]
    text = report_tables.whole_step(*report_data.whole_step_results(rows))
    assert "| B=2,K=8 | graph vs torch.compile reduce-overhead | >= 25x | met: 33.33x faster |" \
        in text
    assert "| B=2,K=8 | graph wall time | <= 20 us | **missed**: 21.0 us |" in text
    assert "<= 1.15x its time | met: 1.05x slower" in text
    assert "HBM floor: L2-resident" in text and "%" not in text
    assert report_data.cases(rows) == []  # no kernel section for these rows


def test_search_quality_section_and_curves_from_stored_data(tmp_path: Path) -> None:
    """quality.json alone: the section names each task's reference, the op's point and each
    sampler's searches within 3% at 25 trials, and draws the curves."""
    gpu_dir = tmp_path / "nvidia-h200"
    (gpu_dir / "tuning").mkdir(parents=True)
    curve = {"best_us": [[110.0, 104.0, 101.0, 100.0]] * 2,
             "percent": [[90.91, 96.15, 99.01, 100.0]] * 2, "complete": [2, 2, 2, 2],
             "within": [0, 1, 2, 2], "median_percent": [90.91, 96.15, 99.01, 100.0],
             "pending": 0}
    censored = {**curve, "complete": [2, 1, 0, 0], "within": [0, 0, 0, 0], "pending": 3}
    entry = {"kernel": "pool.forward", "template": {"HIDDEN_DIM": 128, "N_HORIZONS": 5},
             "shape": {"B": 4096, "K": 256}, "n_points": 52290, "n_timed": 812,
             "exhaustive": False, "reference": {"params": {"BLOCK": 128}, "time_us": 100.0},
             "running": {"params": {"BLOCK": 64}, "time_us": 105.0, "percent": 95.24},
             "verdict": {"speedup": 1.048}, "budgets": [12, 25, 50, 100], "seeds": [0, 1],
             "within": 0.03, "samplers": {"tpe": curve, "tpe-valid": censored}}
    (gpu_dir / "tuning" / "quality.json").write_text(json.dumps(
        {"scheme": "SCHEME TEXT", "winner_at_25": "tpe", "tasks": [entry]}))
    readme = report.build(gpu_dir).read_text()
    section = readme[readme.index("## Search quality"):]
    assert "SCHEME TEXT" in section and "**tpe**" in section
    row = table_row(section, "pool.forward", "HIDDEN_DIM=128,N_HORIZONS=5", "B=4096,K=256")
    assert row[3:] == ["52290", "812", "100", "95.2%", "1.05x", "tpe 1/2; tpe-valid 0/2 (1 censored)"]
    plot = "quality_pool-forward-hidden-dim-128-n-horizons-5-b-4096-k-256.png"
    assert f"![{plot}]({plot})" in section and (gpu_dir / plot).is_file()


def test_flops_by_hand() -> None:
    """The FRD head's six products at the suite model (D_in = F = 128, H*A = 105)."""
    cases = {(c.pass_, c.shape["B"]): c for c in catalog().bench_cases() if c.op == "frdhead"}
    per_row = 2 * (128 * 128 + 105 * 128)  # one forward: layer 1, layer 2
    assert cases[("forward", 65536)].flops() == 65536 * per_row
    assert cases[("fwd+bwd", 65536)].flops() == 3 * 65536 * per_row
    assert cases[("fwd+loss+bwd", 65536)].flops() == 3 * 65536 * per_row
    assert round(cases[("fwd+bwd", 65536)].flops() / 1e9, 1) == 11.7
    assert not [c for c in catalog().bench_cases() if c.op == "pool" and c.flops()]


def test_bench_writes_the_compute_floor_and_a_fused_pass_beside_its_separate_ops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Peers:  # the float64 references in place of torch
        torch = None

        def reset(self) -> None:
            pass

        def to_torch(self, x: dict, device: str) -> dict:
            return dict(x)

        def call(self, spec: Any, x: dict, compiled: bool) -> Any:
            return lambda: spec.reference(*(x[n] for n in spec.reads))

        def max_rel_err(self, library: Any, peer: Any) -> float:
            return 0.0

    class RateHarness(FakeHarness):
        def tf32_tflops(self, peers: Any, reps: int) -> float:
            return 200.0

    monkeypatch.setattr(bench, "_load_peers", lambda device: (Peers(), "fake", ""))
    shape = {"B": step.SMALL_BATCH + 1}
    cat = type(catalog())(dataclasses.replace(s, suite=(shape,)) if s.family == "frdhead"
                          else s for s in catalog())
    b = bench.Bench(RateHarness(), ["frdhead"], quick=False, out_root=tmp_path,
                    commit="abc1234", cat=cat)
    with b.run().open(newline="") as f:
        rows = list(csv.DictReader(f))
    flops = {c.pass_: c.flops() for c in cat.bench_cases() if c.op == "frdhead"}
    compute = {r["pass"]: r for r in rows if r["provider"] == "compute_floor"}
    assert set(compute) == set(flops)
    for pass_, row in compute.items():
        assert float(row["median_us"]) == pytest.approx(3 * flops[pass_] / 200e6, rel=1e-5)
        assert row["note"].endswith(" at 200 TFLOP/s")
    fused = {r["provider"]: r for r in rows if r["pass"] == "fwd+loss+bwd"}
    assert set(fused) == {"floor", "compute_floor", "tuned", "default", "separate",
                          "torch_eager", "torch_compile"}
    assert sorted(json.loads(fused["separate"]["config"])) == [
        "forward", "frd.softmax_ce_grad", "grad_w1", "grad_w2"]
    assert sorted(json.loads(fused["tuned"]["config"])) == ["backward", "forward_loss"]
    readme = report.build(tmp_path / "fake-gpu").read_text()
    label = f"B={shape['B']}"
    assert table_row(readme, label, "10.0", "10.0", "1.00x")  # fused, separate, their ratio
    floor_us = f"{3 * flops['fwd+bwd'] / 200e6:.2f}"  # under 10 us: two decimals
    assert table_row(readme, label, "fwd+bwd", "10.0", floor_us, "200 TFLOP/s")
    assert table_row(readme, label, "fwd+loss+bwd", "10.0")
