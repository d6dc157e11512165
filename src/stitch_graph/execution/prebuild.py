"""Build external candidates' own extensions in parallel, before their GPU jobs run.

A KernelBench file that calls ``torch.utils.cpp_extension.load_inline`` at import builds a
PyTorch extension inside its candidate worker: tens of seconds of nvcc and g++ while that
worker holds the GPU's only slot. A batch of such files (a reward batch, a corpus, a sweep of
candidates) would build one after another. Here each file's top level runs in an isolated
``build`` job of its own, several at once and off the GPU slots, with the extension folder its
candidate worker will use, so that worker finds the build done and only loads it.

A build job runs what its candidate job would run first, nothing more: the file's top level,
with the same build folder. Its failures are not verdicts: the candidate job meets them again
and reports them in its own words.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Candidate
from stitch_graph.execution.executor import Job, run_job
from stitch_graph.execution.forms import load_model_class, prepare_program
from stitch_graph.execution.settings import RunSettings

__all__ = ["BuildOutcome", "builds_extensions", "prebuild_external", "run_build_job"]

_BUILD_MARKS = ("load_inline", "cpp_extension")


@dataclass(frozen=True)
class BuildOutcome:
    """How one candidate's build job ended (``ok``, ``error``, ``timeout``, ...) and how long it
    took; ``reason`` is the worker's when it did not end ``ok``."""

    digest: str
    status: str
    seconds: float
    reason: str = ""


def builds_extensions(candidate: Candidate) -> bool:
    """Whether the candidate is an external file that builds a PyTorch extension of its own."""
    return candidate.form == "external" and any(
        mark in candidate.host_source for mark in _BUILD_MARKS
    )


def run_build_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``build`` jobs: run the candidate file's top level and keep nothing.

    ``load_model_class`` points ``TORCH_EXTENSIONS_DIR`` at the folder beside the build folder,
    as it does in the candidate job, so the extension lands where that job looks for it.
    """
    del scratch
    candidate = Candidate.model_validate(payload["candidate"])
    start = time.perf_counter()
    load_model_class(candidate, payload["build_dir"], None, device=payload.get("device", "cuda"))
    return {"seconds": time.perf_counter() - start}


def _build_one(candidate: Candidate, settings: RunSettings, timeout_s: float) -> BuildOutcome:
    built = prepare_program(
        candidate, build_root=settings.root() / "builds", arch=settings.gpu_arch
    )
    job = Job(
        kind="build",
        payload={"candidate": candidate.model_dump(), "build_dir": built.build_dir},
        timeout_s=timeout_s,
        memory_limit_mb=settings.worker_memory_mb,
    )
    result = run_job(job)
    status = result.status
    reason = result.reason
    if status == "ok" and "error" in result.result:
        status, reason = "error", str(result.result["error"].get("reason", ""))
    return BuildOutcome(candidate.digest, status, round(result.seconds, 2), reason[:300])


def prebuild_external(
    candidates: list[Candidate],
    settings: RunSettings | None = None,
    *,
    jobs: int = 4,
    timeout_s: float = 600.0,
) -> list[BuildOutcome]:
    """Build the extensions of every candidate that builds its own, ``jobs`` at a time.

    Args:
        candidates: Any candidates; those that build no extension (and repeats) are skipped.
        settings: The settings their verification will use (the build folders follow
            ``settings.root()``).
        jobs: Builds at once; each is a worker process running nvcc or g++.
        timeout_s: Limit of one build job.

    Returns:
        One outcome per candidate built, in the order given.
    """
    settings = settings or RunSettings()
    unique = {c.digest: c for c in candidates if builds_extensions(c)}
    if not unique:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(unique)))) as pool:
        return list(pool.map(lambda c: _build_one(c, settings, timeout_s), unique.values()))
