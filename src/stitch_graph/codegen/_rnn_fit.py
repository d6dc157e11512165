"""Whether a recurrent layer's every time step fits in one kernel, and in what shape.

The persistent kernel (``_emit_rnn``) holds W_hh in registers for the whole sequence; the
scheduler's launch count and the emitter agree on when it applies through this one rule.
"""

from __future__ import annotations

import math

__all__ = ["persistent_fit"]


def persistent_fit(gates: int, hidden: int, batch: int, rows: int) -> tuple[int, int, int] | None:
    """(lanes a hidden unit, threads, batch rows a block) of the persistent kernel, or None
    where W_hh does not fit in one block's registers. Each thread holds ``ceil(hidden /
    lanes)`` weights of each of the unit's ``gates`` rows: the fewest lanes that keep that at
    32 or fewer, else the most that fit."""
    rb = rows if rows > 0 else max(1, math.ceil(batch / 128))
    if rb > 4 or 4 * rb * 2 * (hidden + 32) > 48 * 1024:
        return None
    fits = []
    for lanes in (1, 2, 4, 8, 16, 32):
        threads = math.ceil(hidden * lanes / 32) * 32
        weights = gates * math.ceil(hidden / lanes)
        held = weights + gates * (2 * rb + 3) + 24  # registers: weights, prefetch, the rest
        if threads <= 1024 and held <= 255 and threads * held <= 65536:
            fits.append((lanes, threads, weights))
    small = [f for f in fits if f[2] <= 32]
    lanes, threads, _ = small[0] if small else (fits[-1] if fits else (0, 0, 0))
    return (lanes, threads, rb) if fits else None
