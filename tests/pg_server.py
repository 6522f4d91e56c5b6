"""A throw-away PostgreSQL server for the distributed-tuning tests: Debian's ``postgresql``
binaries, a data folder and a Unix socket in a temporary folder, trust authentication."""
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class Server:
    def __init__(self):
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server binaries (apt-get install -y postgresql)")
        self.root = Path(tempfile.mkdtemp(prefix="pycuda-heads-pg-"))
        os.chmod(self.root, 0o755)
        self.data = self.root / "data"
        self.as_user = []
        if os.geteuid() == 0:  # the server refuses to run as root
            shutil.chown(self.root, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run(bin_dir / "initdb", "-D", self.data, "--auth=trust", "-U", "postgres")
        self.pg_ctl = bin_dir / "pg_ctl"
        self._run(self.pg_ctl, "-D", self.data, "-w", "-l", self.root / "log", "-o",
                  f"-k {self.root} -c listen_addresses='' -c max_connections=100", "start")
        self.url = f"postgresql://postgres@/postgres?host={self.root}"

    def _run(self, *cmd):
        proc = subprocess.run([*self.as_user, *map(str, cmd)], capture_output=True, text=True,
                              timeout=120)
        if proc.returncode:
            raise RuntimeError(f"{Path(str(cmd[0])).name} failed: {proc.stderr.strip()[-500:]}")

    def stop(self):
        self._run(self.pg_ctl, "-D", self.data, "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
