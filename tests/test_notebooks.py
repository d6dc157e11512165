"""The notebooks run top to bottom in a real Jupyter kernel, and are committed without outputs.

Each notebook is executed by ``nbclient`` in a fresh ``python3`` kernel (this interpreter, with
``ipykernel``), its working folder an empty temporary one holding only a link to the problem
suite, so nothing it writes lands in the repository. The four run at once, each in its own
kernel, to keep the suite short. The rule-based runs in them need ``nvcc``; without a GPU their
outcome is ``compiled_only``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import stitch_graph
from stitch_graph.toolchain.nvcc import find_nvcc

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = [
    "01_quickstart.ipynb",
    "02_compose_a_graph.ipynb",
    "03_in_an_agent_system.ipynb",
    "04_inspect_a_run.ipynb",
]


def _gpu_present() -> bool:
    from stitch_graph.execution import gpu_available

    return bool(gpu_available())


def test_every_notebook_is_covered():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebooks_carry_no_outputs(name):
    notebook = json.loads((NOTEBOOKS / name).read_text())
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{name} cell {index}: outputs must be cleared"
            assert cell["execution_count"] is None, f"{name} cell {index}: execution count"


def _text(output: dict) -> str:
    """What a cell output shows as text (streams, plain values, Markdown)."""
    if output.get("output_type") == "stream":
        return output["text"]
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    data = output.get("data", {})
    return data.get("text/markdown", "") + data.get("text/plain", "")


async def _execute(path: Path, folder: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    await client.async_execute()
    return notebook


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> dict[str, tuple[str, list[dict], Path]]:
    """Every notebook executed, each in its own kernel and folder: text, outputs and folder."""
    if find_nvcc() is None:
        pytest.skip("the notebooks' rule-based runs build with nvcc")
    folders = {}
    for name in NAMES:
        folder = tmp_path_factory.mktemp(Path(name).stem)
        (folder / "problems").symlink_to(ROOT / "problems", target_is_directory=True)
        folders[name] = folder

    async def run_all():
        return await asyncio.gather(*(_execute(NOTEBOOKS / n, folders[n]) for n in NAMES))

    results = {}
    for name, notebook in zip(NAMES, asyncio.run(run_all()), strict=True):
        outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
        # a stream may come in pieces split anywhere: only other outputs end a line
        text = "".join(_text(o) + ("" if o.output_type == "stream" else "\n") for o in outputs)
        results[name] = (text, outputs, folders[name])
    return results


@pytest.mark.parametrize("name", NAMES)
def test_a_notebook_writes_nothing_into_its_working_folder(executed, name):
    _, _, folder = executed[name]
    assert sorted(p.name for p in folder.iterdir()) == ["problems"]


def test_quickstart(executed):
    text, _, _ = executed["01_quickstart.ipynb"]
    assert f"stitch-graph {stitch_graph.__version__}" in text
    expected = ("verified", "partial") if _gpu_present() else ("compiled_only",)
    assert any(f"outcome              {outcome}" in text for outcome in expected), text
    for event in ("plan ready", "candidate ready", "verdict"):
        assert event in text
    for name in ("program.cu", "host.py", "model_new.py", "report.md", "report.json"):
        assert name in text
    assert "# 01_swish_scale_shift:" in text, "report.md is shown"
    assert 'extern "C" __global__' in text and "class ModelNew" in text


def test_compose_a_graph(executed):
    text, outputs, _ = executed["02_compose_a_graph.ipynb"]
    assert (ROOT / "tests" / "graph" / "graph.mmd").read_text() in text
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs), "an SVG drawn offline"
    assert "| coder_tools |" in text, "the ASCII drawing"
    assert "same shape as the default graph: True" in text
    assert "subgraph stitch" in text and "stitch\\3averifier_tools" in text
    assert "__start__ --> stitch;" in text, "the collapsed drawing"
    assert "ai stitch_graph" in text and "ai   summariser  problem: " in text
    assert "verdicts: [(1, " in text
    assert "TypeError: unknown setting(s) ['max_round']" in text


def test_in_an_agent_system(executed):
    text, _, _ = executed["03_in_an_agent_system.ipynb"]
    assert "'handed to cuda_team'" in text and "ai stitch_graph" in text
    assert "ai   supervisor  'CUDA for problem: " in text, "the supervisor read the result"
    assert '"graph": "stitch_graph"' in text and '"ops_left_to_pytorch": {}' in text
    assert "optimize_with_cuda - Turn a PyTorch program into verified CUDA" in text
    assert "tool  '{\\n \"graph\": \"stitch_graph\"" in text, "the tool answered with JSON"
    assert "run folder: " in text and "program.cu" in text
    assert "artifact has the sources: ['form', 'host_cpp', 'host_source', 'kernel_source']" in text
    assert "'The CUDA team built the program" in text


def test_inspect_a_run(executed):
    text, _, _ = executed["04_inspect_a_run.ipynb"]
    assert "step  2  next=verifier" in text and "step  4  next=(end)" in text
    assert "planner ran again: False" in text
    assert "round 1: compiled=False  compile_error: nvcc failed" in text
    assert "round 2: compiled=True" in text
    assert "children of the checkpoint before the Verifier: 3" in text
