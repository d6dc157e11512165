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
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "ModelNew" in assigned | classes
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
    from stitch_graph.agents.context import StitchContext

    ctx = StitchContext(atol=1e-3, correctness_trials=5, timeout_s=7.0)
    settings = RunSettings.from_context(ctx)
    assert (settings.atol, settings.trials, settings.timeout_s) == (1e-3, 5, 7.0)
    assert RunSettings.from_context(None) == RunSettings()
    assert RunSettings.from_context(settings) is settings


def _built_as_kernelbench_builds(monkeypatch, task, candidate):  # noqa: ANN001, ANN202
    """The exported file's namespace, then ``Model`` and ``ModelNew`` each built after the same
    seed, in KernelBench's order; CuPy stubbed (nothing here launches)."""
    import torch

    text = export_kernelbench(candidate, task)
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.delitem(sys.modules, "_stitch_export_runtime", raising=False)
    namespace: dict = {}
    exec(compile(text, "model_new.py", "exec"), namespace)
    reference_ns: dict = {}
    exec(compile(task.source, "problem.py", "exec"), reference_ns)
    init = reference_ns["get_init_inputs"]()
    torch.manual_seed(3)
    reference = reference_ns["Model"](*init)
    torch.manual_seed(3)
    return namespace, reference, namespace["ModelNew"](*init)


def test_exported_generated_program_starts_from_reference_weights_and_carries_cudnn(monkeypatch):
    """KernelBench builds ModelNew after the same seed as Model and expects the same initial
    weights. A generated convolution calls ``KERNELS.conv``: the export embeds the cuDNN runtime,
    and its launcher finds it beside itself, never through an import of stitch_graph."""
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    task = load_task(str(ROOT / "problems" / "conv" / "01_conv2d_relu.py"))
    ir = capture_program(task)
    candidate = emit_candidate(ir, plan_program(ir))
    assert "KERNELS.conv(" in candidate.host_source
    import torch

    namespace, reference, new = _built_as_kernelbench_builds(monkeypatch, task, candidate)
    expected = reference.state_dict()
    assert set(new.state_dict()) == set(expected)
    for name, value in new.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert any(v.abs().sum() > 0 for v in expected.values())  # random, not zero, weights

    runtime = namespace["_runtime"]()
    assert runtime.Cudnn.__module__ == "_stitch_export_runtime"
    made = []
    monkeypatch.setattr(runtime, "Cudnn", lambda loaded: made.append(loaded) or "cudnn")
    assert runtime.KernelLibrary._cudnn(types.SimpleNamespace()) == "cudnn"
    assert made == [runtime._loaded_library]
    sys.modules.pop("_stitch_export_runtime", None)


_TABLE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(300, 300))
        self.register_buffer("table", torch.randn(300, 300), persistent=False)

    def forward(self, x):
        return x * self.scale + self.table


def get_inputs():
    return [torch.randn(2, 300, 300)]


def get_init_inputs():
    return []
"""


def test_exported_program_takes_non_persistent_buffers_from_the_reference(monkeypatch):
    """A buffer built in ``__init__`` but left out of ``state_dict`` (90,000 elements: too
    large to bake) still reaches the exported ``ModelNew``."""
    import torch

    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    task = load_task(_TABLE)
    ir = capture_program(task)
    _, reference, new = _built_as_kernelbench_builds(
        monkeypatch, task, emit_candidate(ir, plan_program(ir))
    )
    assert torch.equal(new.table, reference.table) and torch.equal(new.scale, reference.scale)
    sys.modules.pop("_stitch_export_runtime", None)
