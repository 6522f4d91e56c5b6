"""Static check (nvcc, no GPU) of every point of the multiadam and headloss spaces: no atomics,
registers and spills, what `pycuda-heads check --all` does for the whole catalog (hours)."""
import sys

from pycuda_heads.catalog import catalog
from pycuda_heads.verify.static_check import jobs, run_checks

FAMILIES = ("multiadam", "headloss")
todo = [j for j in jobs(catalog(), True, ("sm_90",)) if j[0].family in FAMILIES]
bad = 0
for (spec, params, _), rep in zip(todo, run_checks(todo, 8)):
    res = next(iter(rep.entries.values()), None)
    print(spec.id, params, "ok" if rep.ok else "FAIL",
          res and {k: getattr(res, k, None) for k in ("registers", "spill_stores")})
    bad += not rep.ok
print(f"{len(todo)} variants, {bad} failing")
sys.exit(1 if bad else 0)
