"""The README's Python section runs as written, with no API key, on this machine.

The snippet is read from README.md itself, so the two cannot drift apart. It runs in a fresh
interpreter in an empty folder that holds only a link to the problem suite, as a user would run
it from a checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stitch_graph.toolchain.nvcc import find_nvcc

ROOT = Path(__file__).resolve().parents[2]


def python_snippet() -> str:
    """The first Python block of the README's "In Python" section."""
    section = (ROOT / "README.md").read_text().split("## In Python", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_snippet_uses_no_model_and_writes_a_run_folder():
    snippet = python_snippet()
    assert "write_run(" in snippet and "load_task(" in snippet
    assert 'coder_model="' not in snippet.split("#")[0], "a model needs a key"


@pytest.mark.skipif(find_nvcc() is None, reason="the rule-based run builds with nvcc")
def test_the_readme_python_snippet_runs_without_a_key(tmp_path):
    (tmp_path / "problems").symlink_to(ROOT / "problems", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-c", python_snippet()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "planner" in done.stdout and "finalize" in done.stdout
    assert "01_swish_scale_shift: " in done.stdout
    run = tmp_path / "runs" / "demo"
    for name in ("program.cu", "host.py", "report.md", "report.json", "checkpoints.sqlite"):
        assert (run / name).is_file(), name
    assert "__global__" in (run / "program.cu").read_text()
    assert "'program.cu'" in done.stdout
