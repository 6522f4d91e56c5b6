"""The pool's shipped launches at a shape, read from the tuned table (no GPU, no PyCUDA)."""
from __future__ import annotations

import json

from pycuda_heads.core.tuned import table_dir


def shipped(h: int, d: int, b: int, k: int) -> dict:
    """The pool's shipped launches at a shape, by role, given explicitly (a patched tree's
    table entries are for other sources, which the op would not apply)."""
    entries = json.loads((table_dir() / "nvidia-h200.json").read_text())["entries"]
    return {e["kernel"].partition(".")[2]: e["params"] for e in entries
            if e["kernel"].startswith("pool.") and e["shape"] == {"B": b, "K": k}
            and e["template"] == {"N_HORIZONS": h, "HIDDEN_DIM": d}}
