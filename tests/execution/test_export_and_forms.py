"""Export to KernelBench, host-module loading, settings: all without a GPU."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from stitch_graph.artifacts import Candidate, Task
from stitch_graph.execution import (
    RunSettings,
    arch_matches,
    export_kernelbench,
    load_candidate_dir,
    load_model_class,
)

ROOT = Path(__file__).resolve().parents[2]


def test_export_parses_defines_modelnew_and_needs_no_stitch_graph(monkeypatch):
    candidate, meta = load_candidate_dir(ROOT / "examples" / "candidates" / "add_relu")
    task = Task(name="add_relu", source=Path(meta["problem"]).read_text())
    text = export_kernelbench(candidate, task)
    tree = ast.parse(text)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert "stitch_graph" not in imported and {"torch", "cupy"} <= imported
    assigned = {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert "ModelNew" in assigned
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    namespace: dict = {}
    exec(compile(text, "model_new.py", "exec"), namespace)  # KernelBench's way of loading it
    model = namespace["ModelNew"](4096)
    assert model.bias.shape == (4096,)


def test_export_of_shared_form_embeds_host_cpp():
    candidate, meta = load_candidate_dir(ROOT / "examples" / "candidates" / "gemm_bias_relu_cublas")
    text = export_kernelbench(candidate, Task(name="gemm", source=""))
    ast.parse(text)
    assert "cublasSgemm" in text and "'cublas'" in text


def test_load_model_class_injects_globals(tmp_path):
    host = (
        "import torch\n"
        "class ModelNew(torch.nn.Module):\n"
        "    kernels = KERNELS\n"
        "    def forward(self, x):\n"
        "        return x\n"
    )
    cls = load_model_class(
        Candidate(kernel_source="", host_source=host), tmp_path, None, device="cpu"
    )
    assert cls.__name__ == "ModelNew"
    with pytest.raises(RuntimeError, match="without a GPU"):
        cls.kernels.anything  # noqa: B018
    with pytest.raises(TypeError, match="no class `ModelNew`"):
        load_model_class(
            Candidate(kernel_source="", host_source="x = 1"), tmp_path, None, device="cpu"
        )


def test_arch_matches():
    assert arch_matches("sm_90a", (9, 0))
    assert arch_matches("sm_90", (9, 0))
    assert not arch_matches("sm_90a", (8, 0))
    assert arch_matches("sm_100a", (10, 0))
    assert not arch_matches("garbage", (9, 0))


def test_settings_from_context():
    from stitch_graph.context import StitchContext

    ctx = StitchContext(atol=1e-3, correctness_trials=5, timeout_s=7.0)
    settings = RunSettings.from_context(ctx)
    assert (settings.atol, settings.trials, settings.timeout_s) == (1e-3, 5, 7.0)
    assert RunSettings.from_context(None) == RunSettings()
    assert RunSettings.from_context(settings) is settings
