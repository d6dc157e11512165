"""The few run settings that execution needs, readable without the LangChain stack.

``StitchContext`` lives in ``context.py``, which imports LangChain; the GPU machine and the worker
processes do not have (or want) that stack. ``RunSettings`` copies the fields that execution reads
from any object that has them, so a ``StitchContext``, a ``RunSettings`` or ``None`` all work.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["RunSettings", "machine_memory_share_mb"]


def machine_memory_share_mb(share: float = 0.5) -> int:
    """``share`` of this machine's physical memory, MiB (16 GiB where it cannot be read)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 16384
    return max(1024, int(total * share) // (1024 * 1024))


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """Settings of correctness checks, timing and isolation (defaults match ``StitchContext``)."""

    atol: float = 1e-4
    rtol: float = 1e-4
    allow_tf32: bool = False
    correctness_trials: int = 3
    timing_runs: int = 20
    warmup_runs: int = 5
    timeout_s: float = 120.0
    memory_limit_mb: int | None = None
    gpu_arch: str = "sm_90a"
    work_dir: str | None = None
    seed: int = 42

    @classmethod
    def from_context(cls, ctx: Any = None) -> RunSettings:
        """Settings read from a ``StitchContext`` (or any object with these fields), or defaults.

        Args:
            ctx: A ``StitchContext``, a ``RunSettings`` or ``None``.

        Returns:
            The settings; fields the object lacks keep their defaults.
        """
        if ctx is None:
            return cls()
        if isinstance(ctx, cls):
            return ctx
        values = {f.name: getattr(ctx, f.name) for f in fields(cls) if hasattr(ctx, f.name)}
        return cls(**values)

    @property
    def worker_memory_mb(self) -> int:
        """A worker's resident-memory limit: the setting, else half of this machine's memory
        (a whole model's reference needs tens of GiB on a machine that has them)."""
        return self.memory_limit_mb or machine_memory_share_mb()

    @property
    def trials(self) -> int:
        """Correctness trials, never fewer than one."""
        return max(1, int(self.correctness_trials))

    def root(self) -> Path:
        """The folder for builds, caches and scratch folders (created on demand)."""
        base = self.work_dir or os.path.join(tempfile.gettempdir(), f"stitch-graph-{os.getuid()}")
        path = Path(base) / "execution"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def reference_digest(self) -> str:
        """Hash of the settings that change reference outputs or timings."""
        keys = ("allow_tf32", "correctness_trials", "timing_runs", "warmup_runs", "seed")
        data = {k: v for k, v in asdict(self).items() if k in keys}
        data["protocol"] = 2  # 2: the RNG is seeded before each trial's forward
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
