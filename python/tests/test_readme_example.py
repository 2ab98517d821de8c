"""The Python example of the README is a real program: the fenced block
after the line ``<!-- example: examples/python/readme_example.py -->`` in
README.md is that file, byte for byte, and the file runs (in a process of
its own, as a user would run it) and moves and checks its bytes."""

import os
import subprocess
import sys

from conftest import REPO

EXAMPLE = "examples/python/readme_example.py"


def readme_block(marker: str) -> str:
    """The fenced block right after the line ``marker`` in README.md."""
    lines = (REPO / "README.md").read_text().split("\n")
    assert marker in lines, f"README.md has no line {marker!r}"
    i = lines.index(marker) + 1
    assert lines[i].startswith("```"), f"README.md: no fenced block right after {marker!r}"
    end = lines.index("```", i + 1)
    return "\n".join(lines[i + 1 : end]) + "\n"


def test_the_readme_shows_the_example_file():
    block = readme_block(f"<!-- example: {EXAMPLE} -->")
    assert block == (REPO / EXAMPLE).read_text(), (
        f"the Python example in README.md differs from {EXAMPLE}: edit both together"
    )


def test_the_readme_example_runs():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MC_")}
    run = subprocess.run(
        [sys.executable, str(REPO / EXAMPLE)],
        cwd="/tmp",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert run.stdout.startswith("ok: 1048576 bytes written to 127.0.0.1:"), run.stdout
