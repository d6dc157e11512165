"""The reference's timeline: torch.profiler over its forward, per top-level op and host gaps.

Worker side only: the reference worker calls ``forward_timeline`` once its outputs and timings
are taken (``execution.reference``); ``execution.profiling.reference_timeline`` turns the result
into the Planner's ``ProfileReport``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

__all__ = ["forward_timeline"]


def forward_timeline(model: Any, args: list[Any], iterations: int) -> dict[str, Any]:
    """torch.profiler over ``iterations`` forward calls of ``model`` (after three untimed ones).

    Called by the reference worker once its outputs and timings are taken, so the profiler
    never runs while eager or ``torch.compile`` is being timed, and the Planner's timeline
    costs no worker of its own (one had cost a whole model's run 12-19 s before its first
    round on an H200).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(3):
            model(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(iterations):
                with torch.profiler.record_function("stitch_forward"):
                    model(*args)
            torch.cuda.synchronize()
    return _summarize_events(prof.events(), iterations)


def _summarize_events(events: Any, iters: int) -> dict[str, Any]:
    """Per top-level op: device time and kernel launches; plus busy time and host gaps."""
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: {"us": 0.0, "launches": 0})
    kernels: list[tuple[float, float]] = []
    for evt in events:
        device_type = str(getattr(evt, "device_type", "")).upper()
        if "CUDA" in device_type:
            kernels.append((evt.time_range.start, evt.time_range.end))
            continue
        parent = getattr(evt, "cpu_parent", None)
        top = parent is not None and parent.name == "stitch_forward"
        if not top:
            continue
        launched = list(getattr(evt, "kernels", []) or [])
        device_us = float(getattr(evt, "device_time_total", 0.0) or 0.0)
        if not launched:
            # kernels are attached to the op that launched them, often a child op
            launched = [
                k for child in _descendants(evt) for k in (getattr(child, "kernels", []) or [])
            ]
        per_op[evt.name]["us"] += device_us
        per_op[evt.name]["launches"] += len(launched)
    kernels.sort()
    busy = 0.0
    gaps = 0.0
    end = None
    for s, e in kernels:
        if end is not None and s > end:
            gaps += s - end
        busy += max(0.0, e - max(s, end or s))
        end = e if end is None else max(end, e)
    total = sum(v["us"] for v in per_op.values()) or 1.0
    hotspots = [
        {
            "op": op,
            "cuda_time_us": v["us"] / iters,
            "share": v["us"] / total,
            "launches": int(round(v["launches"] / iters)),
        }
        for op, v in per_op.items()
    ]
    hotspots.sort(key=lambda h: h["cuda_time_us"], reverse=True)
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    return {
        "hotspots": hotspots,
        "busy_us": busy / iters,
        "gap_us": gaps / iters,
        "span_us": span / iters,
        "kernels_per_forward": len(kernels) / iters,
    }


def _descendants(evt: Any) -> list[Any]:
    out: list[Any] = []
    stack = list(getattr(evt, "cpu_children", []) or [])
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(getattr(child, "cpu_children", []) or [])
    return out
