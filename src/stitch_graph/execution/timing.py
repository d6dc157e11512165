"""GPU timing that a candidate cannot flatter: events, warm-up, flushed L2, rotated inputs.

Every timed run (candidate, eager and ``torch.compile`` alike) is measured the same way:
``before_each`` refills the inputs in place (so a cache keyed by pointer or content misses), a
buffer larger than L2 is zeroed (so nothing is served from a warm cache), then the start event is
recorded on the current stream, the function runs, the whole device is synchronised (so work left on
side streams is inside the measurement), and the end event is recorded and read. The median of the
runs is reported. Refill and flush are enqueued before the start event, so they are not timed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

__all__ = ["L2_FLUSH_BYTES", "TimingStats", "make_flush_buffer", "time_cuda"]

L2_FLUSH_BYTES = 256 * 1024 * 1024


class TimingStats(dict):
    """``{"median_ms", "mean_ms", "min_ms", "max_ms", "runs", "times_ms"}``; JSON-safe."""


def make_flush_buffer(nbytes: int = L2_FLUSH_BYTES) -> Any:
    """A device buffer larger than any L2 cache, to be ``zero_()``-ed between runs."""
    import torch

    return torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")


def time_cuda(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    runs: int = 20,
    before_each: Callable[[int], None] | None = None,
    flush_buffer: Any = None,
) -> TimingStats:
    """Time ``fn`` on the GPU with CUDA events.

    Args:
        fn: The call to time (e.g. ``lambda: model(*inputs)``).
        warmup: Untimed calls first (each also preceded by ``before_each``).
        runs: Timed calls; the median is reported.
        before_each: Called with the run index before every call, outside the timed region
            (refill inputs here).
        flush_buffer: Buffer zeroed before each timed call; one of 256 MiB is made when ``None``.

    Returns:
        The statistics, milliseconds.
    """
    import torch

    flush = make_flush_buffer() if flush_buffer is None else flush_buffer
    for i in range(max(0, warmup)):
        if before_each is not None:
            before_each(i)
        fn()
    torch.cuda.synchronize()
    times: list[float] = []
    stream = torch.cuda.current_stream()
    for i in range(max(1, runs)):
        if before_each is not None:
            before_each(i)
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        torch.cuda.synchronize()  # every stream of the device, not just the current one
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return TimingStats(
        median_ms=statistics.median(times),
        mean_ms=statistics.fmean(times),
        min_ms=min(times),
        max_ms=max(times),
        runs=len(times),
        times_ms=times,
    )
