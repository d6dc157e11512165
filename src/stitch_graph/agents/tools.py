"""The compiler, profilers and knowledge index as LangChain tools.

The plain functions (``tools.nvcc``, ``tools.ncu``, ``execution``, ``knowledge``) stay the API
for code; these wrappers give a model readable text and hide graph internals: the candidate
and task come from the graph state and the settings from the run context, never from the model.
"""

from __future__ import annotations

from typing import Annotated

from langchain_core.tools import BaseTool, tool
from langgraph.prebuilt import InjectedState
from langgraph.runtime import get_runtime

from stitch_graph.agents.context import StitchContext, resolve_context
from stitch_graph.artifacts import CompileResult, ProfileReport

DEFAULT_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats")


def format_compile_result(result: CompileResult, *, max_diagnostics: int = 20) -> str:
    """A compile result as short text a model (or a person) can act on."""
    lines = [f"nvcc {'succeeded' if result.ok else 'FAILED'} for {result.arch or 'default arch'}"]
    for d in result.diagnostics[:max_diagnostics]:
        where = f"{d.file}:{d.line}" if d.line is not None else d.file or "nvcc"
        lines.append(f"  {where}: {d.severity}: {d.message}")
    if len(result.diagnostics) > max_diagnostics:
        lines.append(f"  ... {len(result.diagnostics) - max_diagnostics} more")
    for r in result.resources:
        lines.append(
            f"  kernel {r.kernel}: {r.registers} registers, {r.shared_bytes} B shared, "
            f"{r.spill_stores_bytes} B spill stores, {r.spill_loads_bytes} B spill loads"
        )
    return "\n".join(lines)


def format_profile(report: ProfileReport, *, max_rows: int = 10) -> str:
    """A profile report as short text."""
    if report.status != "passed":
        return f"profile {report.status}: {report.reason}"
    lines = [f"bottleneck: {report.bottleneck}; headroom ~{report.headroom:.0%} ({report.source})"]
    for k in report.kernels[:max_rows]:
        lines.append(
            f"  {k.name}: {k.duration_us or 0:.1f} us, DRAM {k.dram_pct or 0:.0f}%, "
            f"SM {k.sm_pct or 0:.0f}%, occupancy {k.achieved_occupancy_pct or 0:.0f}%, "
            f"block {k.block_size}, grid {k.grid_size} -> {k.bottleneck}"
        )
    for h in report.hotspots[:max_rows]:
        lines.append(f"  op {h.op}: {h.cuda_time_us:.1f} us ({h.share:.0%}), {h.launches} launches")
    return "\n".join(lines)


def _context() -> StitchContext:
    """The run's settings when called inside the graph, else the defaults."""
    try:
        return resolve_context(get_runtime(StitchContext).context)
    except RuntimeError:  # called outside a graph run
        return StitchContext()


@tool("nvcc_compile")
def nvcc_compile_tool(kernel_source: str) -> str:
    """Compile CUDA C++ source with the real nvcc for the run's GPU architecture.

    Use it on a draft before handing a program over. Returns errors and warnings with line
    numbers, and per kernel the registers, shared memory and spill bytes that ptxas reports.

    Args:
        kernel_source: the complete CUDA translation unit (extern "C" __global__ kernels).
    """
    from stitch_graph.toolchain.nvcc import nvcc_compile

    ctx = _context()
    return format_compile_result(
        nvcc_compile(kernel_source, arch=ctx.gpu_arch, work_dir=_build_dir(ctx))
    )


@tool("ncu_profile")
def ncu_profile_tool(
    state: Annotated[dict, InjectedState],
    sections: list[str] | None = None,
    kernel_filter: str | None = None,
    launch_count: int = 3,
) -> str:
    """Profile the current candidate's kernels with Nsight Compute (hardware counters).

    Returns per kernel: time, DRAM and SM throughput as % of peak, achieved occupancy, launch
    configuration and a bottleneck class (memory, compute, latency, launch).

    Args:
        sections: ncu sections, e.g. ["SpeedOfLight", "Occupancy", "MemoryWorkloadAnalysis"].
        kernel_filter: only kernels whose name matches this regular expression.
        launch_count: how many kernel launches to profile.
    """
    from stitch_graph.execution import profile_candidate

    if "candidate" not in state or "task" not in state:
        return "no candidate to profile yet"
    report = profile_candidate(
        state["task"],
        state["candidate"],
        _context(),
        sections=tuple(sections or DEFAULT_SECTIONS),
        kernel_filter=kernel_filter,
        launch_count=launch_count,
    )
    return format_profile(report)


@tool("timeline_profile")
def timeline_profile_tool(state: Annotated[dict, InjectedState]) -> str:
    """Time the reference PyTorch program op by op (torch.profiler; nsys where installed).

    Returns the hotspots: per-op CUDA time, share of the total and launch count.
    """
    from stitch_graph.execution import reference_timeline

    if "task" not in state:
        return "no task loaded"
    return format_profile(reference_timeline(state["task"], _context()))


@tool("search_cuda_knowledge")
def search_cuda_knowledge_tool(query: str, k: int = 3) -> str:
    """Search the CUDA optimisation knowledge index for advice.

    Phrase the query as a finding, e.g. "DRAM throughput 90%, elementwise kernel" or
    "ptxas 128 bytes spill stores". Returns the best entries with their advice and sources.

    Args:
        query: what the profiler or compiler showed, or the technique you need.
        k: how many entries to return.
    """
    from stitch_graph.knowledge import search_cuda_knowledge

    return search_cuda_knowledge(query, k=k)


def _build_dir(ctx: StitchContext) -> str | None:
    return ctx.work_dir and f"{ctx.work_dir}/builds"


def coder_tools() -> list[BaseTool]:
    """Tools the Coder may call while drafting."""
    return [nvcc_compile_tool, search_cuda_knowledge_tool]


def verifier_tools() -> list[BaseTool]:
    """Tools the Verifier may call while analysing a correct candidate."""
    return [ncu_profile_tool, timeline_profile_tool, search_cuda_knowledge_tool]


def all_tools() -> list[BaseTool]:
    """Every tool the agents use, once each, for a user's own tool-calling agent."""
    by_name = {t.name: t for t in [*coder_tools(), *verifier_tools()]}
    return list(by_name.values())
