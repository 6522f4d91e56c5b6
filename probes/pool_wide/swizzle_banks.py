"""Shared-memory wavefronts of LAYOUT 5's ring reads and copies (no GPU): a bank model (32 banks
of 4 bytes; a warp's access split into 128-byte phases, each phase as many wavefronts as its
most-hit bank has distinct words) of the padded rows (HIDDEN_DIM + 4 floats) against the
swizzled ones of `probes/pending/l5-swizzle` (HIDDEN_DIM floats, 16-byte chunks XOR f(r % 8)).

    python probes/pool_wide/swizzle_banks.py
"""
from __future__ import annotations

from typing import Callable

D, KC = 512, 16


def padded(r: int, c: int) -> int:
    return r * (D + 4) + c


def swizzled(r: int, c: int) -> int:
    q, h = r & 3, r >> 2 & 1
    return r * D + (((c >> 2) ^ (2 * (q ^ h) + h)) << 2) + (c & 3)


def wavefronts(words: list[int], width: int) -> int:
    """A warp's access, lane l reading `width` floats from word words[l]."""
    per_phase, total = 32 // width, 0
    for p in range(0, len(words), per_phase):
        banks: dict[int, set[int]] = {}
        for w in words[p:p + per_phase]:
            for e in range(width):
                banks.setdefault((w + e) % 32, set()).add(w + e)
        total += max(len(v) for v in banks.values())
    return total


def worst(at: Callable[[int, int], int]) -> dict[str, int]:
    lanes = [(g, t) for g in range(8) for t in range(4)]
    out = {"scores, single floats": 0, "scores, 8-byte pairs": 0, "columns": 0, "copies": 0}
    for d0 in range(0, D, 64):
        for k0 in range(0, 64, 8):
            for h in (0, 8):
                for plus in (0, 4):
                    w = [at(g + h, d0 + k0 + t + plus) for g, t in lanes]
                    out["scores, single floats"] = max(out["scores, single floats"],
                                                       wavefronts(w, 1))
                w = [at(g + h, d0 + k0 + 2 * t) for g, t in lanes]
                out["scores, 8-byte pairs"] = max(out["scores, 8-byte pairs"], wavefronts(w, 2))
        for k0 in (0, 8):
            for e in (0, 1):
                for i in range(4):
                    for h in (0, 8):
                        w = [at(k0 + 2 * t + e, d0 + 16 * i + g + h) for g, t in lanes]
                        out["columns"] = max(out["columns"], wavefronts(w, 1))
    for r in range(KC):
        for c0 in range(0, D, 128):
            out["copies"] = max(out["copies"], wavefronts([at(r, c0 + 4 * l) for l in range(32)], 4))
    return out


if __name__ == "__main__":
    assert sorted(swizzled(r, c) for r in range(KC) for c in range(D)) == list(range(KC * D))
    print("ideal: single floats 1, pairs 2, columns 1, copies 4 wavefronts a warp")
    for name, at in (("padded", padded), ("swizzled", swizzled)):
        print(name, worst(at))
