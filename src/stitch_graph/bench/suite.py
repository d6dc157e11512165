"""A sweep's problems, its rows on disk, and the summary users compare sweeps by.

Rows live in an append-only JSON Lines file: each finished problem is one line, written and
``fsync``-ed before the next starts, so a sweep killed at any moment keeps every row it finished
and a torn last line (killed mid-write) is skipped on reading. The first line names the machine;
a sweep resumed elsewhere keeps the earlier rows (each row names its own host and device) and says
that the machine changed.

The summary follows KernelBench's ``fast_p``: the share of *all* problems whose program is correct
and more than ``p`` times faster than a baseline (``fast_0`` is the success rate), with geometric
means of the speedups over the correct rows, per group (the problem's first folder: a KernelBench
level, a suite folder) and overall.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = [
    "BASELINES",
    "FAST_P",
    "RowStore",
    "find_problems",
    "geomean",
    "group_of",
    "machine_info",
    "speedup",
    "summarize",
]

BASELINES = {
    "eager": "eager (FP32)",
    "eager_default_flags": "eager (default flags, cuDNN TF32)",
    "compile": "torch.compile",
    "reduce_overhead": "torch.compile reduce-overhead",
}
"""Row key prefix of each baseline's time (``<key>_ms``) and the label reports give it."""

FAST_P = (0.0, 1.0, 1.5, 2.0)


def find_problems(root: Path, only: list[str] | None = None) -> list[Path]:
    """Problem files under ``root`` (subfolders included), sorted by folder and number.

    Args:
        root: A KernelBench level folder, a folder of levels, or the project's suite.
        only: Keep files whose path relative to ``root`` contains one of these texts.

    Returns:
        The files; names starting with ``_`` or ``.`` are skipped.
    """

    def key(path: Path) -> tuple[str, int, str]:
        head = path.stem.split("_", 1)[0]
        return (str(path.parent), int(head) if head.isdigit() else 10**9, path.stem)

    found = [
        p
        for p in root.rglob("*.py")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)
    ]
    if only:
        found = [p for p in found if any(t in str(p.relative_to(root)) for t in only)]
    return sorted(found, key=key)


def group_of(problem: str) -> str:
    """The group of a problem given relative to the suite: its first folder, else ``suite``."""
    parts = Path(problem).parts
    return parts[0] if len(parts) > 1 else "suite"


def machine_info() -> dict[str, Any]:
    """Host, GPU and software of this machine (the GPU name without initialising CUDA)."""
    import torch

    from stitch_graph.execution.executor import gpu_available, visible_gpus
    from stitch_graph.execution.reference import device_label

    gpu = gpu_available()
    return {
        "host": platform.node(),
        "gpu": device_label("cuda") if gpu else None,
        "gpus": len(visible_gpus()) if gpu else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


class RowStore:
    """The rows of one sweep in ``folder/rows.jsonl``, appended one finished problem at a time.

    Args:
        folder: The sweep's output folder (created).
        machine: This machine (``machine_info()``); written as the first line of a new file.
    """

    FILE = "rows.jsonl"

    def __init__(self, folder: Path, machine: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / self.FILE
        self.machine = machine
        self.header, self.rows = self._read()
        if self.header is None:
            self.header = {"machine": machine, "started": time.time()}
            self._append({"header": self.header})

    def _read(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        if not self.path.exists():
            return None, []
        header, rows = None, []
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill mid-write; its problem runs again
            if "header" in entry and header is None:
                header = entry["header"]
            elif "problem" in entry:
                rows.append(entry)
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:
            latest[row["problem"]] = row  # a problem run again replaces its earlier row
        return header, list(latest.values())

    def machine_change(self) -> str | None:
        """A line saying the earlier rows came from another host or GPU, or None."""
        before = (self.header or {}).get("machine", {})
        changed = [
            f"{key} {before.get(key)!r} -> {self.machine.get(key)!r}"
            for key in ("host", "gpu", "torch", "cuda")
            if before.get(key) != self.machine.get(key)
        ]
        if not changed:
            return None
        return (
            f"resuming {self.path} written on another machine ({'; '.join(changed)}): its "
            f"{len(self.rows)} rows are kept, each names the host it ran on"
        )

    def done(self, *, retry_errors: bool = False) -> set[str]:
        """Problems that already have a row (rows of errors too, unless ``retry_errors``)."""
        return {
            r["problem"] for r in self.rows if not (retry_errors and r.get("outcome") == "error")
        }

    def add(self, row: dict[str, Any]) -> None:
        """Append ``row`` durably (written and fsync-ed) and keep it."""
        self._append(row)
        self.rows = [r for r in self.rows if r["problem"] != row["problem"]] + [row]

    def _append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(line)
            stream.flush()
            os.fsync(stream.fileno())


def speedup(row: dict[str, Any], baseline: str) -> float | None:
    """The baseline's time over the candidate's, where both were measured."""
    base, ours = row.get(f"{baseline}_ms"), row.get("candidate_ms")
    return base / ours if base and ours else None


def geomean(values: list[float | None]) -> float | None:
    """Geometric mean of the positive values (None when there are none)."""
    kept = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else None


def _summary_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    correct = [r for r in rows if r.get("correct")]
    checked = any(r.get("correct") is not None for r in rows)  # none: no GPU, nothing ran
    out: dict[str, Any] = {
        "problems": len(rows),
        "correct": len(correct),
        "compiled_only": sum(1 for r in rows if r.get("outcome") == "compiled_only"),
        "partial": sum(1 for r in correct if r.get("declared_torch_ops")),
        "errors": sum(1 for r in rows if r.get("outcome") == "error"),
        "success_rate": len(correct) / len(rows) if rows and checked else None,
        "geomean": {},
        "fast_p": {},
        "timed": {},
    }
    for baseline in BASELINES:
        ratios = [s for r in correct if (s := speedup(r, baseline)) is not None]
        out["timed"][baseline] = len(ratios)
        out["geomean"][baseline] = geomean(ratios)
        out["fast_p"][baseline] = {
            f"{p:g}": (sum(1 for s in ratios if s > p) / len(rows) if rows and checked else None)
            for p in FAST_P
        }
    return out


def summarize(rows: list[dict[str, Any]], *, gpu: bool | None = None) -> dict[str, Any]:
    """Success rate, fast_p and geometric means per group and overall.

    Args:
        rows: The sweep's rows.
        gpu: Whether this machine has a GPU; None: whether any row was timed.

    Returns:
        ``{"groups": {name: summary}, "all": summary, "gpu": bool, "note": str}``.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("group") or group_of(row["problem"]), []).append(row)
    timed = any(r.get("candidate_ms") for r in rows)
    has_gpu = timed if gpu is None else gpu
    note = ""
    if not has_gpu:
        note = (
            "no GPU: programs were built (compiled_only) but neither checked nor timed; "
            "run the sweep on a machine with an NVIDIA GPU for correctness and speedups"
        )
    return {
        "groups": {name: _summary_of(group) for name, group in sorted(groups.items())},
        "all": _summary_of(rows),
        "gpu": has_gpu,
        "note": note,
    }
