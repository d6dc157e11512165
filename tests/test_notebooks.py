"""The notebooks run top to bottom: every code cell, in order, in one namespace.

No Jupyter is needed: cells are executed with plain ``exec``. Where IPython is not installed, its
``display``/``Markdown`` are replaced by stand-ins that record what would have been shown. Each
notebook runs in a temporary working directory (with a link to the problem suite), so files it
writes stay out of the repository.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


class _Markdown:
    def __init__(self, data: str = "") -> None:
        self.data = data


def _stub_ipython(monkeypatch: pytest.MonkeyPatch, shown: list[Any]) -> None:
    """Install a minimal ``IPython.display`` when IPython is absent."""
    if importlib.util.find_spec("IPython") is not None:
        import IPython.display

        monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
        return
    package = types.ModuleType("IPython")
    display_module = types.ModuleType("IPython.display")
    display_module.display = lambda *objs, **kw: shown.extend(objs)
    display_module.Markdown = _Markdown
    package.display = display_module
    monkeypatch.setitem(sys.modules, "IPython", package)
    monkeypatch.setitem(sys.modules, "IPython.display", display_module)


def run_notebook(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], list[Any]]:
    """Execute the code cells of ``notebooks/name``; return the namespace and what was shown."""
    notebook = json.loads((NOTEBOOKS / name).read_text())
    assert notebook["nbformat"] == 4
    shown: list[Any] = []
    _stub_ipython(monkeypatch, shown)
    (tmp_path / "problems").symlink_to(ROOT / "problems", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    # a registered module, as Jupyter's __main__ is: typing resolves class annotations through it
    module = types.ModuleType(f"_notebook_{Path(name).stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs"), f"{name} cell {index}: outputs must be cleared"
        source = "".join(cell["source"])
        exec(compile(source, f"{name}[{index}]", "exec"), namespace)
    return namespace, shown


def test_every_notebook_is_covered():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "01_draw_and_compose.ipynb",
        "02_run_rule_based.ipynb",
    ]


def test_draw_and_compose(tmp_path, monkeypatch, capsys):
    ns, shown = run_notebook("01_draw_and_compose.ipynb", tmp_path, monkeypatch)
    assert "verifier_tools" in ns["mermaid"]
    assert ns["mermaid"] == (ROOT / "tests" / "graph" / "graph.mmd").read_text()
    assert (tmp_path / "stitch_graph.mmd").read_text() == ns["mermaid"]
    assert "coder_tools" in ns["coder_mermaid"] and "verifier" not in ns["coder_mermaid"]
    assert "summarise --> __end__" in ns["team_mermaid"]
    assert "subgraph stitch" in ns["team_mermaid"]
    assert ns["tool"].name == "optimize_with_cuda"
    assert ns["mixed"].coder_model == "openai:gpt-4.1" and ns["mixed"].max_rounds == 6
    mermaid_blocks = [getattr(obj, "data", "") for obj in shown]
    assert len(mermaid_blocks) == 3 and all(b.startswith("```mermaid") for b in mermaid_blocks)
    out = capsys.readouterr().out
    assert "same shape as the default graph: True" in out
    assert "TypeError: unknown setting(s) ['max_round']" in out


def _codegen_missing() -> str | None:
    """The module notebook 2 needs that is not importable yet, or None."""
    try:
        from stitch_graph.codegen import emit_candidate, plan_program  # noqa: F401
    except ImportError as exc:
        return f"stitch_graph.codegen is not ready ({exc})"
    return None


def _gpu_present() -> bool:
    try:
        from stitch_graph.execution import gpu_available
    except ImportError:
        return False
    return bool(gpu_available())


def test_run_rule_based(tmp_path, monkeypatch, capsys):
    missing = _codegen_missing()
    if missing:
        pytest.skip(missing)
    ns, shown = run_notebook("02_run_rule_based.ipynb", tmp_path, monkeypatch)
    report = ns["report"]
    assert report.outcome in {"verified", "partial", "compiled_only"}, report.summary
    if not _gpu_present():
        assert report.outcome == "compiled_only", report.summary
    agents = {event["agent"] for event in ns["events"]}
    assert {"planner", "coder", "verifier", "finalize"} <= agents
    assert "__global__" in ns["program"].kernel_source
    assert "ModelNew" in ns["program"].host_source
    assert any(getattr(obj, "data", "").startswith(f"# {report.task}:") for obj in shown)
    assert report.summary in capsys.readouterr().out
