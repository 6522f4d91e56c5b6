"""The log of tuning runs of one GPU (``runs.json`` next to the caches): when, how long, how
much was tried. Export sums it into the table's provenance."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RUNS = "runs.json"


def read_runs(tdir: Path) -> list[dict[str, Any]]:
    path = Path(tdir) / RUNS
    return json.loads(path.read_text()) if path.is_file() else []


def append_run(tdir: Path, record: dict[str, Any]) -> None:
    path = Path(tdir) / RUNS
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = read_runs(tdir) + [record]
    tmp = path.with_name(RUNS + ".tmp")
    tmp.write_text(json.dumps(runs, indent=1))
    os.replace(tmp, path)
