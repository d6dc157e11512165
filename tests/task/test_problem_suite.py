"""Every problem of the project's suite (``problems/``) loads, with its outputs inferred."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.task import load_task

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
FILES = sorted(PROBLEMS.rglob("*.py"))


def test_suite_size() -> None:
    assert len(FILES) >= 32
    groups = {p.parent.name for p in FILES}
    assert {"elementwise", "reduction", "norm", "softmax", "gemm", "conv", "models"} <= groups
    assert sum(p.parent.name == "models" for p in FILES) >= 5


def test_readme_lists_every_problem() -> None:
    readme = (PROBLEMS / "README.md").read_text()
    for path in FILES:
        assert path.relative_to(PROBLEMS).as_posix() in readme


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(PROBLEMS).as_posix())
def test_problem_loads(path: Path) -> None:
    task = load_task(path)
    assert task.outputs, f"{path.name}: no outputs inferred"
    assert all(spec is None or spec.dtype == "float32" for spec in task.inputs)
    assert all(spec.numel > 0 for spec in task.outputs)
