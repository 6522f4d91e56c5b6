"""Render variants at base and worktree, compile to PTX, show diffs. usage: ptxdiff.py BASE [idx...]"""
from pathlib import Path
import hashlib
import subprocess
import sys
import tempfile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from pycuda_heads.verify import identity as I
base = sys.argv[1]

todo = I.variants("pool", 16)
idx = [int(a) for a in sys.argv[2:]] or list(range(len(todo)))
sel = [todo[i] for i in idx]
root = ROOT
before = I.render_at(I._revision(root, base), sel, root)
after = I.render_at(None, sel, root)
def ptx(src):
    key = hashlib.sha256(src.encode()).hexdigest()[:20]
    p = Path(f"/tmp/pool_ptxdiff/cache/{key}.ptx")
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as t:
            cu = Path(t)/"v.cu"; cu.write_text(src)
            subprocess.run(["nvcc","-O3","-arch=compute_90","--ptx","-o",str(p),str(cu)],check=True)
    return I.strip_ptx(p.read_text())
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(2) as ex:
    pb = list(ex.map(ptx, [b["source"] for b in before]))
    pa = list(ex.map(ptx, [a["source"] for a in after]))
for i, v, a, b in zip(idx, sel, pb, pa):
    same = a == b
    print(i, v["kernel"], v["params"].get("LAYOUT"), "SAME" if same else "DIFF")
    if not same:
        Path(f"/tmp/pool_ptxdiff/{i}.base.ptx").write_text(a); Path(f"/tmp/pool_ptxdiff/{i}.head.ptx").write_text(b)
