"""Fold one GPU round's results (the unpacked step folders of probes/gpu_round.sh) into the
repository: validation records merged per family, bench rows appended, tuning caches and the
tuned table copied, the full GPU-test record kept (a `-k` subset is not copied).

    python probes/merge_round.py DIR COMMIT [--full-tests]

COMMIT overrides the commit field the device wrote (its .git can be stale).
"""
import argparse
import csv
import shutil
from pathlib import Path

from pycuda_heads.catalog import catalog
from pycuda_heads.perf.bench import append_rows
from pycuda_heads.records import read_json, write_json
from pycuda_heads.verify.validation import merge_record

REPORTS = Path("reports/nvidia-h200")


def merge_validation(rep: Path, commit: str) -> None:
    new = read_json(rep)
    record = REPORTS / "validation.json"
    old = read_json(record) if record.is_file() else None
    cat = catalog()
    by_family: dict[str, list] = {}
    for v in new["variants"]:
        by_family.setdefault(cat[v["kernel"]].family, []).append(v)
    # the round's record starts as a copy of the repository's: only the families it ran changed
    by_family = {f: vs for f, vs in by_family.items()
                 if new["families"][f] != (old or {}).get("families", {}).get(f)}
    merged = old
    for family, variants in by_family.items():
        run = {k: v for k, v in new["families"][family].items() if k != "source_hash"}
        merged = merge_record(merged, variants, {**run, "commit": commit}, cat)
    write_json(record, merged)
    print(f"validation: {sorted(by_family)} merged")


def merge_bench(csv_path: Path, commit: str) -> None:
    with csv_path.open(newline="") as f:
        rows = [{**r, "commit": commit} for r in csv.DictReader(f)]
    append_rows(REPORTS / "bench.csv", rows)
    print(f"bench: {len(rows)} rows appended")


def merge_tuning(folder: Path) -> None:
    caches = folder / "tuning"
    if caches.is_dir():  # caches, run records, the study journal; not the workers' lock files
        shutil.copytree(caches, REPORTS / "tuning", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", "*.fcntl-lock"))
    table = folder / "nvidia-h200.json"
    if table.is_file():
        shutil.copy(table, Path("pycuda_heads/tuned/nvidia-h200.json"))
    print(f"tuning: caches and table from {folder}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("commit")
    ap.add_argument("--full-tests", action="store_true",
                    help="the round ran every GPU test: keep its record")
    args = ap.parse_args()
    for rep in sorted(args.dir.glob("**/rep/nvidia-h200/validation.json")):
        merge_validation(rep, args.commit)
    for bench in sorted(args.dir.glob("**/bench/nvidia-h200/bench.csv")):
        merge_bench(bench, args.commit)
    for step in ("sweep", "tune"):
        if (args.dir / step).is_dir():
            merge_tuning(args.dir / step)
    tests = args.dir / "tests" / "gpu_tests.json"
    if args.full_tests and tests.is_file():
        shutil.copy(tests, REPORTS / "gpu_tests.json")
        print("gpu tests: record kept")


if __name__ == "__main__":
    main()
