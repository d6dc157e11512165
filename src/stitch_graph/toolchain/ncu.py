"""Profile a program with Nsight Compute and say what limits its dominant kernel.

A speed-up is only worth chasing where there is headroom, and the kind of headroom decides the
fix: a memory-bound kernel wants fewer bytes (fusion, vector loads), a compute-bound one fewer or
cheaper instructions, a latency-bound one more parallelism, and a launch-bound one fewer kernels.
``ncu --csv --page details`` reports the figures that tell these apart; this module builds that
command, runs it, parses its CSV into :class:`~stitch_graph.artifacts.KernelMetrics` and reduces
them to a :class:`~stitch_graph.artifacts.ProfileReport`. Profiling is advisory, so nothing here
raises on a failed profile: a missing ncu, missing counter permissions, a crash or a timeout all
come back as a report with ``status`` ``"not_run"`` or ``"error"`` and a reason.
"""

from __future__ import annotations

import csv
import glob
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from stitch_graph.artifacts import Bottleneck, KernelMetrics, ProfileReport
from stitch_graph.toolchain.locate import find_cuda_tool
from stitch_graph.toolchain.process import run_tool

__all__ = [
    "BOUND_PCT",
    "DEFAULT_SECTIONS",
    "LATENCY_PCT",
    "LAUNCH_MAX_BLOCKS",
    "LAUNCH_MAX_US",
    "LEAN_MARGIN_PCT",
    "NcuRule",
    "classify_bottleneck",
    "find_ncu",
    "ncu_command",
    "ncu_profile",
    "parse_ncu_csv",
    "parse_ncu_rules",
    "summarize_profile",
]

DEFAULT_SECTIONS: tuple[str, ...] = ("SpeedOfLight", "Occupancy", "LaunchStats")
"""Sections that are enough to classify a kernel; cheap to collect (few replay passes)."""

BOUND_PCT = 60.0
"""A unit at or above this % of peak throughput is considered the limiter."""
LATENCY_PCT = 40.0
"""Below this % of peak on both memory and SM, neither unit is busy: the kernel is latency-bound."""
LEAN_MARGIN_PCT = 15.0
"""Between LATENCY_PCT and BOUND_PCT, a unit this many points above the other still decides."""
LAUNCH_MAX_US = 5.0
"""Kernels shorter than this (µs) are dominated by launch overhead when their grid is tiny."""
LAUNCH_MAX_BLOCKS = 264
"""A grid of at most this many blocks (two waves on a 132-SM H100/H200) counts as tiny."""

NcuRule = tuple[str, str, str, float | None]
"""One ncu rule result: (kernel name, rule name, description, estimated speedup in % or None)."""

_NOT_FOUND_HINT = (
    "Install NVIDIA Nsight Compute (it ships with the CUDA toolkit) and put ncu on PATH, "
    "or set STITCH_NCU to the ncu executable."
)
_PERMISSION_HINT = (
    "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM). Run as root, "
    "or load the NVIDIA driver with NVreg_RestrictProfilingToAdminUsers=0 "
    "(see https://developer.nvidia.com/ERR_NVGPUCTRPERM)."
)


# --------------------------------------------------------------------------------------------
# Finding and running ncu


def find_ncu() -> str | None:
    """Locate the ncu executable.

    Looks at ``$STITCH_NCU`` first (when set, it is the only candidate), then ``ncu`` on
    ``PATH``, ``$CUDA_HOME/bin/ncu``, ``/usr/local/cuda/bin/ncu`` and the newest
    ``/opt/nvidia/nsight-compute/<version>/ncu``.

    Returns:
        The path of an executable ncu, or ``None``.
    """
    pattern = os.path.join(os.sep, "opt", "nvidia", "nsight-compute", "*", "ncu")
    return find_cuda_tool("ncu", extra=sorted(glob.glob(pattern), key=_version_key, reverse=True))


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", Path(path).parent.name))


def ncu_command(
    program: Sequence[str],
    *,
    sections: Sequence[str] = DEFAULT_SECTIONS,
    kernel_filter: str | None = None,
    launch_skip: int = 0,
    launch_count: int | None = 1,
    clock_control: str = "none",
    set_full: bool = False,
    print_units: str | None = "base",
    extra: Sequence[str] = (),
    ncu: str | None = None,
) -> list[str]:
    """Build the ncu command line that profiles ``program`` into CSV on stdout.

    Args:
        program: The program and its arguments, e.g. ``["python", "bench.py"]``.
        sections: ncu section identifiers to collect; ignored when ``set_full``.
        kernel_filter: Kernel name to profile; a regex unless it already names a match kind
            (``regex:``, ``exact:`` ...), e.g. ``"axpy"`` becomes ``-k regex:axpy``.
        launch_skip: Matching launches to skip first (warm-up).
        launch_count: Matching launches to profile; ``None`` profiles all of them.
        clock_control: ``"none"`` keeps the GPU's own clocks (figures like real runs);
            ``"base"`` locks base clocks (steadier, slower).
        set_full: Collect ``--set full`` instead of the listed sections.
        print_units: ``"base"`` prints ns, bytes, ... without auto-scaling; ``None`` keeps
            ncu's default.
        extra: Further ncu options, placed before the program.
        ncu: ncu executable; found with :func:`find_ncu`, else plain ``"ncu"``.

    Returns:
        The argument vector.

    Raises:
        ValueError: For an empty program or negative launch numbers.
    """
    if not program:
        msg = "program must name an executable to profile"
        raise ValueError(msg)
    if launch_skip < 0 or (launch_count is not None and launch_count < 1):
        msg = f"launch_skip must be >= 0 and launch_count >= 1, got {launch_skip}, {launch_count}"
        raise ValueError(msg)
    cmd = [ncu or find_ncu() or "ncu", "--csv", "--page", "details"]
    cmd += ["--clock-control", clock_control]
    if print_units:
        cmd += ["--print-units", print_units]
    if set_full:
        cmd += ["--set", "full"]
    else:
        for section in sections:
            cmd += ["--section", section]
    if kernel_filter:
        has_kind = re.match(r"^(regex|exact|demangled|function|mangled):", kernel_filter)
        cmd += ["-k", kernel_filter if has_kind else f"regex:{kernel_filter}"]
    cmd += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        cmd += ["--launch-count", str(launch_count)]
    cmd += [str(e) for e in extra]
    cmd += [str(p) for p in program]
    return cmd


def ncu_profile(
    program: Sequence[str],
    *,
    sections: Sequence[str] = DEFAULT_SECTIONS,
    kernel_filter: str | None = None,
    launch_skip: int = 0,
    launch_count: int | None = 1,
    clock_control: str = "none",
    set_full: bool = False,
    extra: Sequence[str] = (),
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> ProfileReport:
    """Run ``program`` under ncu and summarise what it found.

    Args:
        program: The program and its arguments.
        sections: See :func:`ncu_command`.
        kernel_filter: See :func:`ncu_command`.
        launch_skip: See :func:`ncu_command`.
        launch_count: See :func:`ncu_command`.
        clock_control: See :func:`ncu_command`.
        set_full: See :func:`ncu_command`.
        extra: See :func:`ncu_command`.
        timeout_s: Wall-clock limit; profiling replays each kernel, so it is slow.
        env: Variables added to (and overriding) this process's environment.
        cwd: Working folder of the program.

    Returns:
        ``status="passed"`` with per-launch metrics, the dominant kernel's bottleneck and the
        estimated headroom; ``"not_run"`` when ncu is missing or may not read the counters;
        ``"error"`` when the program fails, nothing was profiled or ncu times out.
    """
    if not program:
        return ProfileReport(status="error", source="ncu", reason="no program to profile")
    ncu = find_ncu()
    if ncu is None:
        explicit = os.environ.get("STITCH_NCU")
        where = (
            f"STITCH_NCU={explicit!r} is not an executable file"
            if explicit
            else "ncu is not on PATH, in /usr/local/cuda/bin or /opt/nvidia/nsight-compute"
        )
        return ProfileReport(
            status="not_run", source="ncu", reason=f"ncu not found: {where}. {_NOT_FOUND_HINT}"
        )
    try:
        cmd = ncu_command(
            program,
            sections=sections,
            kernel_filter=kernel_filter,
            launch_skip=launch_skip,
            launch_count=launch_count,
            clock_control=clock_control,
            set_full=set_full,
            extra=extra,
            ncu=ncu,
        )
    except ValueError as exc:
        return ProfileReport(status="error", source="ncu", reason=str(exc))

    run = run_tool(cmd, cwd=cwd, env={**os.environ, **(env or {})}, timeout_s=timeout_s)
    if run.start_error is not None:
        reason = f"could not start ncu: {run.start_error}"
        return ProfileReport(status="error", source="ncu", reason=reason)
    if run.timed_out:
        return ProfileReport(
            status="error",
            source="ncu",
            reason=(
                f"ncu timed out after {timeout_s:g} s; profile fewer launches "
                "(kernel_filter, launch_count) or fewer sections, or raise timeout_s"
            ),
        )
    return _report_from_output(run.returncode, run.stdout, run.stderr)


def _report_from_output(returncode: int, stdout: str, stderr: str) -> ProfileReport:
    both = f"{stdout}\n{stderr}"
    if "ERR_NVGPUCTRPERM" in both:
        return ProfileReport(status="not_run", source="ncu", reason=_PERMISSION_HINT)
    kernels = parse_ncu_csv(stdout) or parse_ncu_csv(both)
    problems = [
        ln.strip()
        for ln in both.splitlines()
        if ln.startswith("==ERROR==") or "No kernels were profiled" in ln
    ]
    if not kernels:
        detail = "; ".join(problems) or _tail(both)
        reason = f"no kernels were profiled (exit status {returncode})"
        if detail:
            reason += f": {detail}"
        reason += ". Check that the program launches the kernel and that kernel_filter matches it."
        return ProfileReport(status="error", source="ncu", reason=reason)
    report = summarize_profile(kernels, rules=parse_ncu_rules(stdout))
    if returncode != 0:
        detail = "; ".join(problems) or _tail(stderr or stdout)
        report.status = "error"
        report.reason = f"program exited with status {returncode} ({detail}). {report.reason}"
    return report


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


# --------------------------------------------------------------------------------------------
# Parsing the CSV

_TIME_TO_US = {
    "ns": 1e-3,
    "nsecond": 1e-3,
    "nsec": 1e-3,
    "us": 1.0,
    "usecond": 1.0,
    "usec": 1.0,
    "µs": 1.0,
    "ms": 1e3,
    "msecond": 1e3,
    "msec": 1e3,
    "s": 1e6,
    "second": 1e6,
}
_PCT_FIELDS = {
    "DRAM Throughput": "dram_pct",
    "Compute (SM) Throughput": "sm_pct",
    "Memory Throughput": "memory_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
}


def _rows(text: str) -> list[dict[str, str]]:
    """CSV rows as dicts, skipping ncu's ``==...==`` lines and any program output."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",')), None)
    if start is None:
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    reader = csv.reader(body)
    header = next(reader)
    rows = []
    for values in reader:
        if values == header or not values or not values[0].strip().isdigit():
            continue
        rows.append(dict(zip(header, values, strict=False)))
    return rows


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _dims_product(text: str) -> int | None:
    dims = re.findall(r"\d+", text.replace(",", " ") if "(" in text else text.replace(",", ""))
    if not dims:
        return None
    n = 1
    for d in dims:
        n *= int(d)
    return n


def parse_ncu_csv(text: str) -> list[KernelMetrics]:
    """Parse ``ncu --csv --page details`` output into one :class:`KernelMetrics` per launch.

    Tolerates the ``==PROF==``/``==WARNING==`` lines and program output around the CSV,
    thousands separators (``57,568``) and auto-scaled units. Durations become microseconds.
    Every numeric metric is also stored in ``metrics`` under ``"Section Name/Metric Name"``
    (time metrics in µs, others as printed); rule rows, which have no metric name, are skipped
    (see :func:`parse_ncu_rules`). Each launch is classified with :func:`classify_bottleneck`.

    Args:
        text: ncu's stdout.

    Returns:
        Launches in profiling order.
    """
    launches: dict[tuple[str, str], KernelMetrics] = {}
    for row in _rows(text):
        key = (row.get("Process ID", ""), row.get("ID", ""))
        km = launches.get(key)
        if km is None:
            km = KernelMetrics(name=row.get("Kernel Name", "").strip() or "?")
            km.block_size = _dims_product(row.get("Block Size", ""))
            km.grid_size = _dims_product(row.get("Grid Size", ""))
            launches[key] = km
        name = row.get("Metric Name", "").strip()
        if not name:
            continue
        value = _number(row.get("Metric Value", ""))
        if value is None:
            continue
        unit = row.get("Metric Unit", "").strip()
        if unit in _TIME_TO_US:
            value *= _TIME_TO_US[unit]
        section = row.get("Section Name", "").strip()
        km.metrics[f"{section}/{name}"] = value
        _assign(km, name, unit, value)
    for km in launches.values():
        km.bottleneck = classify_bottleneck(km)
    return list(launches.values())


def _assign(km: KernelMetrics, name: str, unit: str, value: float) -> None:
    if name == "Duration" and unit in _TIME_TO_US:
        km.duration_us = value
    elif name in _PCT_FIELDS and unit == "%":
        setattr(km, _PCT_FIELDS[name], value)
    elif name == "Registers Per Thread":
        km.registers_per_thread = int(value)
    elif name == "Block Size" and km.block_size is None:
        km.block_size = int(value)
    elif name == "Grid Size" and km.grid_size is None:
        km.grid_size = int(value)


def parse_ncu_rules(text: str) -> list[NcuRule]:
    """Rule results (the advice ncu prints, e.g. ``SOLBottleneck``) from the same CSV.

    Args:
        text: ncu's stdout.

    Returns:
        ``(kernel, rule name, description, estimated speedup %)`` per rule row, in order; the
        speedup is ``None`` where ncu gives none.
    """
    rules: list[NcuRule] = []
    for row in _rows(text):
        rule = row.get("Rule Name", "").strip()
        if not rule or row.get("Metric Name", "").strip():
            continue
        rules.append(
            (
                row.get("Kernel Name", "").strip(),
                rule,
                row.get("Rule Description", "").strip(),
                _number(row.get("Estimated Speedup", "")),
            )
        )
    return rules


# --------------------------------------------------------------------------------------------
# Interpreting the figures


def classify_bottleneck(m: KernelMetrics) -> Bottleneck:
    """Say what limits a kernel, from its speed-of-light and launch figures.

    Rules, in order (thresholds are the module constants):

    1. ``"launch"``: shorter than ``LAUNCH_MAX_US`` µs with a grid of at most
       ``LAUNCH_MAX_BLOCKS`` blocks (or an unknown grid): launch overhead dominates.
    2. ``"unknown"``: neither memory nor SM throughput was measured.
    3. Let *mem* be the higher of memory and DRAM throughput, *sm* the SM throughput (% of peak).
       If the higher of the two is at least ``BOUND_PCT``, that unit (``"memory"`` or
       ``"compute"``; a tie counts as memory).
    4. If both are below ``LATENCY_PCT``: ``"latency"`` (too few warps in flight, from low
       occupancy or too small a grid, or long dependency chains).
    5. In between: the higher unit if it leads by at least ``LEAN_MARGIN_PCT`` points, else
       ``"latency"``.

    Args:
        m: One kernel launch.

    Returns:
        The bottleneck.
    """
    if m.duration_us is not None and m.duration_us < LAUNCH_MAX_US:
        if m.grid_size is None or m.grid_size <= LAUNCH_MAX_BLOCKS:
            return "launch"
    mem_values = [v for v in (m.memory_pct, m.dram_pct) if v is not None]
    if not mem_values and m.sm_pct is None:
        return "unknown"
    mem = max(mem_values) if mem_values else 0.0
    sm = m.sm_pct if m.sm_pct is not None else 0.0
    top: Bottleneck = "memory" if mem >= sm else "compute"
    high, low = max(mem, sm), min(mem, sm)
    if high >= BOUND_PCT:
        return top
    if high < LATENCY_PCT:
        return "latency"
    return top if high - low >= LEAN_MARGIN_PCT else "latency"


def _utilization(m: KernelMetrics) -> float | None:
    values = [v for v in (m.dram_pct, m.memory_pct, m.sm_pct) if v is not None]
    return max(values) / 100.0 if values else None


def summarize_profile(
    kernels: Sequence[KernelMetrics], *, rules: Sequence[NcuRule] = ()
) -> ProfileReport:
    """Reduce per-launch metrics to one report.

    Each launch gets its bottleneck (:func:`classify_bottleneck`). The dominant kernel is the
    one with the most total time over its launches; its bottleneck is the report's. ``headroom``
    is the time-weighted ``1 - utilization`` over the launches with a duration, where
    utilization is the highest of DRAM, memory and SM throughput as a fraction of peak (for one
    kernel: ``1 - max(dram_pct, sm_pct, memory_pct) / 100``), clipped to ``[0, 1]``.

    Args:
        kernels: Launches, as :func:`parse_ncu_csv` returns them.
        rules: Rule results; the dominant kernel's best-rated advice is quoted in ``reason``.

    Returns:
        ``status="passed"`` with the figures, or ``status="error"`` when there are no kernels.
    """
    if not kernels:
        return ProfileReport(status="error", source="ncu", reason="no kernels were profiled")
    launches = [k.model_copy(update={"bottleneck": classify_bottleneck(k)}) for k in kernels]

    totals: dict[str, float] = {}
    for k in launches:
        totals[k.name] = totals.get(k.name, 0.0) + (k.duration_us or 0.0)
    dominant_name = max(totals, key=lambda n: totals[n])  # first seen wins ties
    dominant = max(
        (k for k in launches if k.name == dominant_name), key=lambda k: k.duration_us or 0.0
    )

    timed = [(k.duration_us, _utilization(k)) for k in launches if k.duration_us]
    timed = [(d, u) for d, u in timed if u is not None]
    if timed:
        total = sum(d for d, _ in timed)
        headroom = sum(d * (1.0 - u) for d, u in timed) / total
    else:
        util = _utilization(dominant)
        headroom = 1.0 - util if util is not None else 0.0
    headroom = min(1.0, max(0.0, headroom))

    all_time = sum(totals.values())
    parts = [f"{dominant.name} dominates"]
    if all_time > 0:
        share = totals[dominant_name] / all_time
        parts[0] += f" ({totals[dominant_name]:.1f} us, {share:.0%} of profiled kernel time)"
    figures = [
        f"{label} {value:.0f}%"
        for label, value in (
            ("DRAM", dominant.dram_pct),
            ("memory", dominant.memory_pct),
            ("SM", dominant.sm_pct),
            ("achieved occupancy", dominant.achieved_occupancy_pct),
        )
        if value is not None
    ]
    parts.append(f"{dominant.bottleneck}-bound" + (f" ({', '.join(figures)})" if figures else ""))
    advice = sorted(
        (r for r in rules if r[0] == dominant_name and r[3] is not None),
        key=lambda r: r[3] or 0.0,
        reverse=True,
    )
    if advice:
        parts.append(
            "ncu rules (estimated speedup): " + ", ".join(f"{r[1]} {r[3]:.0f}%" for r in advice[:3])
        )
    return ProfileReport(
        status="passed",
        source="ncu",
        reason="; ".join(parts),
        kernels=launches,
        bottleneck=dominant.bottleneck,
        headroom=round(headroom, 4),
    )
