"""Worker process entry point: ``python -m stitch_graph.execution.worker JOB.json``.

Each job runs in a process of its own so a crash, hang or poisoned CUDA context ends with the
process and never reaches the parent. The worker reads the job, runs the handler of its kind, writes
``result.json`` next to the job file, and leaves with ``os._exit`` (a CUDA context broken by an
illegal access can hang ordinary interpreter teardown). Python-level failures become a structured
``{"error": {...}}`` result; anything worse is diagnosed by the parent from the exit status.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["describe_exception", "main"]


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """A JSON-safe description of ``exc`` with a one-line, classified ``reason``."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    lowered = text.lower()
    if "out of memory" in lowered or name == "OutOfMemoryError":
        kind = "CUDA out of memory"
    elif "illegal memory access" in lowered or "illegal_address" in lowered:
        kind = "illegal memory access (CUDA error 700)"
    elif "misaligned address" in lowered or "misaligned_address" in lowered:
        kind = "misaligned address (CUDA error 716)"
    elif "cuda error" in lowered or "cuda_error" in lowered or "cudaerror" in lowered:
        kind = "CUDA error"
    else:
        kind = "Python exception"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "kind": kind,
        "type": name,
        "message": text[:4000],
        "reason": f"{kind}: {name}: {first}"[:1000],
        "traceback": tb[-6000:],
    }


def _handler(kind: str) -> Callable[[dict[str, Any], Path], dict[str, Any]]:
    if kind == "reference":
        from stitch_graph.execution.reference import run_reference_job

        return run_reference_job
    if kind == "candidate":
        from stitch_graph.execution.candidate import run_candidate_job

        return run_candidate_job
    if kind == "timeline":
        from stitch_graph.execution.profiling import run_timeline_job

        return run_timeline_job
    if kind == "runner":
        from stitch_graph.execution.profiling import run_runner_job

        return run_runner_job
    msg = f"unknown job kind {kind!r}"
    raise ValueError(msg)


def _write_result(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the job file named in ``argv`` and write its result; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m stitch_graph.execution.worker JOB.json", file=sys.stderr)
        return 2
    job_path = Path(args[0]).resolve()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files from crashing kernels
    except (ImportError, ValueError, OSError):
        pass
    job = json.loads(job_path.read_text())
    scratch = job_path.parent
    try:
        result = _handler(job["kind"])(job.get("payload", {}), scratch)
    except BaseException as exc:  # noqa: BLE001 - everything a candidate raises is a result
        result = {"error": describe_exception(exc)}
    _write_result(scratch / "result.json", result)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
