"""Turning profiler and compiler findings into advice drawn from the knowledge index.

The Verifier knows *what* is wrong (DRAM at 92%, 256 bytes of spills, an undefined identifier);
this module phrases each finding as a query, retrieves the matching entries and condenses each
into a :class:`~stitch_graph.artifacts.FeedbackItem` the Coder can act on, citing the entry as
``knowledge:<id>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stitch_graph.artifacts import CompileResult, FeedbackItem, KernelMetrics, ProfileReport
from stitch_graph.knowledge.corpus import KnowledgeEntry
from stitch_graph.knowledge.index import KnowledgeIndex, default_index, tokenize

__all__ = [
    "Finding",
    "advice_for_compile",
    "advice_for_profile",
    "findings_for_compile",
    "findings_for_profile",
]

_RELATIVE_FLOOR = 0.7
_SM_COUNT_HINT = 132  # H100/H200 SXM; a grid below this cannot fill the device.
_BOTTLENECK_QUERIES = {
    "memory": "memory-bound kernel: DRAM throughput near peak, compute low; move fewer bytes, "
    "coalesced and vectorised loads, fuse elementwise ops",
    "compute": "compute-bound kernel: Compute (SM) throughput high, memory low; instruction mix, "
    "tensor cores",
    "latency": "latency-bound kernel: both DRAM and compute throughput low; occupancy, small "
    "grid, instruction-level parallelism",
    "launch": "launch-bound program: many tiny kernels, host gaps between launches; CUDA graphs, "
    "kernel fusion",
}


@dataclass(frozen=True)
class Finding:
    """One observation worth a lookup: what was seen, and the query that describes it."""

    summary: str
    query: str
    bottlenecks: tuple[str, ...] = ()


def _metric(kernel: KernelMetrics, *needles: str) -> float | None:
    for key, value in kernel.metrics.items():
        name = key.lower()
        if all(n in name for n in needles):
            return value
    return None


def findings_for_profile(report: ProfileReport) -> list[Finding]:
    """Observations in a profile, most important first (the slowest kernels lead)."""
    out: list[Finding] = []
    kernels = sorted(report.kernels, key=lambda k: -(k.duration_us or 0.0))
    for kernel in kernels[:3]:
        name = kernel.name
        dram, sm = kernel.dram_pct, kernel.sm_pct
        stores = _metric(kernel, "spill", "store") or 0.0
        spills = stores + (_metric(kernel, "spill", "load") or 0.0)
        if spills > 0:
            regs = kernel.registers_per_thread or 0
            out.append(Finding(
                f"{name}: {spills:.0f} bytes of register spills ({regs} registers per thread)",
                f"ptxas spill stores spill loads local memory, {regs} registers per thread",
                ("latency", "memory", "compile"),
            ))
        if dram is not None and dram >= 60 and (sm is None or sm < 50):
            out.append(Finding(
                f"{name}: memory-bound, DRAM throughput {dram:.0f}% of peak"
                + (f", compute {sm:.0f}%" if sm is not None else ""),
                f"DRAM throughput {dram:.0f}% of peak, compute low, memory-bound kernel; "
                "fuse elementwise ops, coalesced vectorised float4 loads, fewer bytes",
                ("memory",),
            ))
        if sm is not None and sm >= 60 and (dram is None or dram < 50):
            out.append(Finding(
                f"{name}: compute-bound, Compute (SM) throughput {sm:.0f}%",
                f"Compute (SM) throughput {sm:.0f}%, memory low, compute-bound; instruction mix, "
                "FMA pipe, tensor cores",
                ("compute",),
            ))
        occ = kernel.achieved_occupancy_pct
        if occ is not None and occ < 40:
            extra = f" with {kernel.block_size} threads per block" if kernel.block_size else ""
            out.append(Finding(
                f"{name}: achieved occupancy {occ:.0f}%{extra}",
                f"low achieved occupancy {occ:.0f}%{extra}; block size, registers and shared "
                "memory limit resident warps",
                ("latency",),
            ))
        regs = kernel.registers_per_thread
        if regs is not None and regs > 128 and spills <= 0:
            out.append(Finding(
                f"{name}: {regs} registers per thread limit occupancy",
                f"{regs} registers per thread, block limit registers, register pressure, "
                "__launch_bounds__",
                ("latency", "compile"),
            ))
        if kernel.grid_size is not None and kernel.grid_size < _SM_COUNT_HINT:
            out.append(Finding(
                f"{name}: grid of {kernel.grid_size} blocks cannot fill the GPU",
                f"small grid of {kernel.grid_size} blocks, fewer blocks than SMs, idle SMs, "
                "latency bound",
                ("latency", "launch"),
            ))
        if dram is not None and sm is not None and dram < 30 and sm < 30 and not out:
            out.append(Finding(
                f"{name}: neither memory nor compute is busy (DRAM {dram:.0f}%, SM {sm:.0f}%)",
                f"DRAM {dram:.0f}% and compute {sm:.0f}% both low, latency bound, stalls, "
                "instruction-level parallelism, occupancy",
                ("latency",),
            ))
    launches = sum(h.launches for h in report.hotspots)
    if report.bottleneck == "launch" or launches >= 20:
        out.append(Finding(
            f"{launches or 'many'} kernel launches; launch overhead dominates",
            f"host gaps between {launches or 'many'} tiny kernels, launch overhead; CUDA graphs "
            "and kernel fusion",
            ("launch",),
        ))
    if report.bottleneck in _BOTTLENECK_QUERIES and not any(
        report.bottleneck in f.bottlenecks for f in out
    ):
        out.append(Finding(
            f"bottleneck: {report.bottleneck}",
            _BOTTLENECK_QUERIES[report.bottleneck],
            (report.bottleneck,),
        ))
    return out


def findings_for_compile(result: CompileResult) -> list[Finding]:
    """Observations in a build: error diagnostics first, then ptxas resource warnings."""
    out: list[Finding] = []
    seen: set[str] = set()
    for diag in result.errors[:5]:
        message = diag.message.strip()
        if message in seen:
            continue
        seen.add(message)
        where = f"{diag.file}:{diag.line}: " if diag.file and diag.line else ""
        out.append(Finding(f"{where}{message}"[:200], f"compile error: {message}", ()))
    if not result.ok and not out:
        lines = [ln for ln in result.log.splitlines() if "error" in ln.lower()]
        for line in lines[:3]:
            out.append(Finding(line.strip()[:200], f"compile error: {line.strip()}", ()))
    for res in result.resources:
        spilled = res.spill_stores_bytes + res.spill_loads_bytes
        if spilled > 0:
            out.append(Finding(
                f"{res.kernel}: {res.spill_stores_bytes} bytes spill stores, "
                f"{res.spill_loads_bytes} bytes spill loads, {res.registers} registers",
                f"ptxas: {res.spill_stores_bytes} bytes spill stores, {res.spill_loads_bytes} "
                f"bytes spill loads, {res.registers} registers; register pressure",
                ("latency", "compile"),
            ))
        elif res.registers > 128:
            out.append(Finding(
                f"{res.kernel}: {res.registers} registers per thread",
                f"ptxas: {res.registers} registers per thread limit occupancy; register pressure, "
                "__launch_bounds__, maxrregcount",
                ("latency", "compile"),
            ))
        if res.shared_bytes > 48 * 1024:
            out.append(Finding(
                f"{res.kernel}: {res.shared_bytes} bytes of shared memory per block",
                f"{res.shared_bytes} bytes shared memory per block, dynamic shared memory opt-in, "
                "occupancy",
                ("compile", "latency"),
            ))
    return out


_BULLET = re.compile(r"^\s*(?:[-*]|\d+\.)\s+(.*)$")


def _advice_sentences(entry: KnowledgeEntry, query: str, limit: int = 2) -> list[str]:
    """The entry's list items that best match the query, else its opening sentences."""
    items: list[str] = []
    current: list[str] = []
    in_code = False
    for line in entry.body.splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        match = _BULLET.match(line)
        if match:
            if current:
                items.append(" ".join(current))
            current = [match.group(1).strip()]
        elif current and line.startswith("  ") and line.strip():
            current.append(line.strip())
        elif current:
            items.append(" ".join(current))
            current = []
    if current:
        items.append(" ".join(current))
    items = [re.sub(r"\s+", " ", i.replace("`", "")).strip() for i in items]
    if not items:
        prose = re.sub(r"```.*?```|^#.*$", " ", entry.body, flags=re.DOTALL | re.MULTILINE)
        prose = re.sub(r"\s+", " ", prose.replace("`", "")).strip()
        return [_first_sentence(s) for s in re.split(r"(?<=[.!?])\s+", prose)[:limit]]
    wanted = set(tokenize(query))
    ranked = sorted(
        enumerate(items), key=lambda p: (-len(wanted & set(tokenize(p[1]))), p[0])
    )
    chosen = [_first_sentence(text) for _, text in sorted(ranked[:limit])]
    return [t if t.endswith((".", "!", "?")) else t + "." for t in chosen]


def _first_sentence(text: str, limit: int = 220) -> str:
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z_(])", text, maxsplit=1)[0].rstrip(":;, ")
    if len(sentence) > limit:
        sentence = sentence[: limit - 1].rsplit(" ", 1)[0] + "…"
    return sentence


def _items(
    findings: list[Finding], index: KnowledgeIndex | None, k: int, per_finding: int
) -> list[FeedbackItem]:
    if not findings or k <= 0:
        return []
    index = index if index is not None else default_index()
    items: list[FeedbackItem] = []
    used: set[str] = set()
    for finding in findings:
        hits = index.search(finding.query, k=per_finding + len(used), mode="hybrid")
        if not hits:
            continue
        # Beyond the best hit, take only near-ties: a weak fourth entry is noise, not advice.
        floor = _RELATIVE_FLOOR * hits[0].score
        fresh = [h for h in hits if h.id not in used and h.score >= floor][:per_finding]
        for hit in fresh:
            entry = index.get(hit.id)
            advice = " ".join(_advice_sentences(entry, finding.query))
            items.append(
                FeedbackItem(
                    action=entry.short_action,
                    detail=f"{finding.summary}. {advice}".strip(),
                    source=f"knowledge:{entry.id}",
                )
            )
            used.add(hit.id)
            if len(items) >= k:
                return items
    return items


def advice_for_profile(
    report: ProfileReport, index: KnowledgeIndex | None = None, k: int = 3
) -> list[FeedbackItem]:
    """Advice for a profile: one query per finding, the best entries condensed into items.

    Args:
        report: What the profilers found (bottleneck class, per-kernel metrics, hotspots).
        index: The index to ask; defaults to :func:`default_index`.
        k: At most this many items.

    Returns:
        Items whose ``source`` is ``knowledge:<entry id>``; empty when nothing stands out.
    """
    findings = findings_for_profile(report)
    per_finding = max(1, -(-k // max(len(findings), 1)))
    return _items(findings, index, k, per_finding)


def advice_for_compile(
    result: CompileResult, index: KnowledgeIndex | None = None, k: int = 3
) -> list[FeedbackItem]:
    """Advice for a build: error diagnostics and ptxas resource problems (spills, >128 registers).

    Args:
        result: The build outcome with diagnostics and per-kernel resources.
        index: The index to ask; defaults to :func:`default_index`.
        k: At most this many items.

    Returns:
        Items whose ``source`` is ``knowledge:<entry id>``; empty for a clean build.
    """
    findings = findings_for_compile(result)
    per_finding = max(1, -(-k // max(len(findings), 1)))
    return _items(findings, index, k, per_finding)
