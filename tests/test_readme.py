"""The README's snippets as written: every Python block compiles and, on a GPU, runs (in order,
in one process: later blocks use earlier names); every ``pycuda-heads`` command of a shell block,
in the README and in docs/, parses with the real command line; the test command is CI's."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```$", README, flags=re.S | re.M)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = [code for page in DOCS
         for lang, code in re.findall(r"^```(\w+)\n(.*?)^```$", page.read_text(), flags=re.S | re.M)
         if lang == "sh"]


def test_every_code_block_says_its_language():
    fences = re.findall(r"^```(\w*)$", README, flags=re.M)
    assert len(fences) == 2 * len(BLOCKS) and len(BLOCKS) >= 6
    assert not re.search(r"\n\n    \S", README), "an indented code block: fence it"


@pytest.mark.parametrize("number", range(len(PYTHON)))
def test_each_python_block_compiles(number):
    compile(PYTHON[number], f"README.md python block {number}", "exec")


def _commands():
    """Every ``pycuda-heads`` invocation of the shell blocks, as argument lists."""
    out = []
    for code in SHELL:
        for line in code.splitlines():
            for part in line.split("#")[0].split("&&"):
                words = shlex.split(part)
                if words[:1] == ["pycuda-heads"]:
                    out.append(words[1:])
    return out


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a)[:50])
def test_each_command_parses(argv):
    pytest.importorskip("optuna", reason="the tuning commands register with the tune extra")
    from pycuda_heads.cli import parser
    args, unknown = parser().parse_known_args(argv)
    assert not unknown and args.command == argv[0]


def test_the_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    [tests] = [code for code in SHELL if "pytest" in code]
    assert ci == tests.strip(), "README's test command and .ci/run differ"


def test_the_first_screen_shows_install_numpy_and_torch_use():
    first = "\n".join(README.splitlines()[:40])
    assert 'pip install ".[gpu,torch]"' in first
    assert "pool.forward(q_h, ln)" in first and "torch.compile(" in first


@pytest.mark.gpu
def test_the_python_blocks_run_in_order(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("pycuda")
    script = tmp_path / "readme.py"
    script.write_text("\n".join(PYTHON))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
