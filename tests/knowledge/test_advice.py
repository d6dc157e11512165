"""Advice from profiles and builds cites the right knowledge entries."""

from __future__ import annotations

from stitch_graph.artifacts import (
    CompileResult,
    Diagnostic,
    KernelMetrics,
    KernelResources,
    ProfileReport,
)
from stitch_graph.cli.knowledge import cmd_search
from stitch_graph.knowledge.advice import advice_for_compile, advice_for_profile
from stitch_graph.knowledge.tool import search_cuda_knowledge

MEMORY_ENTRIES = {
    "knowledge:coalescing",
    "knowledge:vectorized-loads",
    "knowledge:elementwise-fusion",
    "knowledge:roofline-memory-bound",
    "knowledge:reduction-fusion",
}


def test_memory_bound_profile_yields_memory_advice(real_index) -> None:
    report = ProfileReport(
        status="passed",
        bottleneck="memory",
        kernels=[KernelMetrics(name="add_mul_sigmoid", duration_us=180.0, dram_pct=92.0,
                               sm_pct=8.0, achieved_occupancy_pct=88.0, block_size=256,
                               grid_size=8192, bottleneck="memory")],
    )
    items = advice_for_profile(report, index=real_index, k=3)
    assert 1 <= len(items) <= 3
    assert all(i.source.startswith("knowledge:") and i.action and i.detail for i in items)
    assert {i.source for i in items} & MEMORY_ENTRIES
    assert items[0].source in MEMORY_ENTRIES


def test_spill_report_yields_register_pressure_advice(real_index) -> None:
    result = CompileResult(ok=True, resources=[
        KernelResources(kernel="gemm_tile", registers=255, spill_stores_bytes=256,
                        spill_loads_bytes=320)])
    items = advice_for_compile(result, index=real_index)
    assert items[0].source == "knowledge:register-pressure-spills"
    assert "255 registers" in items[0].detail


def test_compile_error_yields_fix(real_index) -> None:
    result = CompileResult(ok=False, diagnostics=[
        Diagnostic(file="k.cu", line=12, message='identifier "__shfl_down" is undefined')])
    items = advice_for_compile(result, index=real_index)
    assert items[0].source in {"knowledge:compile-undefined-identifier", "knowledge:warp-shuffle"}
    assert advice_for_compile(CompileResult(ok=True), index=real_index) == []


def test_tool_and_cli_render(as_default, capsys) -> None:
    text = search_cuda_knowledge("ptxas: 256 bytes spill stores, 255 registers", k=2)
    assert text.startswith("Knowledge entries for:") and "[register-pressure-spills]" in text
    assert cmd_search("wave quantization tail effect", 2, "hybrid") == 0
    assert "tail-effect-waves" in capsys.readouterr().out
    assert cmd_search("x", 2, "fuzzy") == 2
