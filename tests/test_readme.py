"""Every snippet of README.md runs: the Python blocks under mpiexec at 1, 3 and 4 ranks
(one after another in one program, as a reader follows them), the command lines that
need no cluster or GPU as they are written.

A block may use names the prose leaves to the reader; ``GIVEN`` defines them just before
the line that uses them, and nothing else is added. The GPU block runs where CuPy sees a
GPU, and is skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to Python or on PATH")

# names a block uses that the README leaves to the reader, by a line the block contains
GIVEN = {
    "x.dtype == matrix": "x = np.zeros(3, matrix)\nx['m'] = np.eye(2, dtype=np.int64) + comm.rank\n",
    "comm.all_reduce(grad,": ("grad = np.ones(1000, np.float32)\n"
                              "def compute_something_else():\n    return 0.0\n"),
    "pairs = np.zeros(n, mpicoll.loc_dtype": ("n = 4\nlocal_values = np.arange(4.0) * comm.rank\n"
                                               "offset = 4 * comm.rank\n"),
    "comm.all_reduce_init(grad,": ("grad = np.ones(1000, np.float32)\nsteps = 3\n"
                                   "def compute_gradient(step):\n    return step\n"),
}


def blocks(language: str) -> list[str]:
    with open(README) as f:
        text = f.read()
    return [textwrap.dedent(b) for b in re.findall(rf"```{language}\n(.*?)```", text, re.S)]


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver
        return False


def program() -> str:
    """The README's Python blocks as one program, each run with what the prose gives."""
    parts = ["import numpy as np\nimport mpicoll\ncomm = mpicoll.Communicator()\n"]
    for block in blocks("python"):
        if "import cupy" in block and not gpu_available():
            continue
        for marker, given in GIVEN.items():
            block = "\n".join(given + line if marker in line else line
                              for line in block.splitlines())
        parts.append(block)
    parts.append("comm.barrier()\nif comm.rank == 0:\n    print('README snippets ran')\n")
    return "\n".join(parts)


def test_every_python_block_is_used():
    names = [marker for marker in GIVEN if not any(marker in b for b in blocks("python"))]
    assert not names, f"GIVEN names blocks the README no longer has: {names}"
    assert len(blocks("python")) >= 5


@needs_mpiexec
@pytest.mark.parametrize("n", [1, 3, 4])
def test_python_snippets_run(tmp_path, n):
    script = tmp_path / "readme_snippets.py"
    script.write_text(program())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_"))}
    done = subprocess.run(["timeout", "-k", "5", "180", MPIEXEC, "-n", str(n), sys.executable,
                           "-m", "mpi4py", str(script)],  # (timeout's TERM ends the ranks too)
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=210,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "README snippets ran" in done.stdout


# command lines of the README that run here quickly, and those that do not, with why
SKIPPED_COMMANDS = {
    "bash scripts/bench.sh": "the main job (minutes): scripts/bench.sh is run by hand and CI",
    "bash scripts/test.sh": "the whole suite itself",
    "my_script.py": "a user's script; the line is run with examples/library_use.py instead",
    "mpicoll.model fit": "measures the machine (tests/test_units.py covers the fit's parts)",
}


def commands() -> list[str]:
    lines = []
    for block in blocks("sh"):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command:
                lines.append(command)
    return lines


def test_command_lines_are_known():
    assert commands(), "README.md lost its command blocks"


@needs_mpiexec
def test_command_lines_run(tmp_path):
    bin_dir = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_"))}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT
    pytest.importorskip("matplotlib")
    ran = 0
    for command in commands():
        reason = next((why for part, why in SKIPPED_COMMANDS.items() if part in command), None)
        if reason and "my_script.py" in command:
            command = command.replace("my_script.py", os.path.join(ROOT, "examples",
                                                                   "library_use.py"))
            command = command.replace("-n 4", "-n 3")
        elif reason:
            continue
        words = shlex.split(command)
        done = subprocess.run("timeout -k 5 180 env " + " ".join(shlex.quote(w) for w in words),
                              shell=True, cwd=tmp_path, env=env, capture_output=True, stdin=subprocess.DEVNULL,
                              text=True, timeout=210)  # (timeout's TERM ends the ranks too)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        ran += 1
    assert ran >= 5
