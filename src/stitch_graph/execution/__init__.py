"""Execution: run candidate programs and their references in isolated worker processes.

Everything here exists so that a verdict can be trusted. Each candidate runs in a fresh worker
process (own process group, timeout, memory watch, scrubbed environment, own scratch folder); the
reference runs in another, once per task, so candidate code can never touch what it is judged
against. The next worker is started (and imports torch) while the current job runs, so a fresh
process per job costs little time. Correctness is strict (fresh seeded draws, FP32 tolerances, NaN/alias/unwritten checks);
timing uses CUDA events with flushed L2 and refilled inputs, in the same run as eager and
``torch.compile``. Modules import torch and CuPy lazily, so this package loads without either.

``round.verify_candidate`` is the parent's entry point for one candidate and ``worker`` the worker
process's, with the dispatch table of job kinds; both sit on top of ``candidate``, ``reference``
and ``profiling``, which never import them back.
"""

from typing import Any

from stitch_graph.execution.compare import (
    aliases_any,
    compare_output,
    flatten_outputs,
    merge_checks,
    summarize_checks,
)
from stitch_graph.execution.executor import (
    Executor,
    Job,
    JobResult,
    LocalGPUExecutor,
    gpu_available,
    run_job,
    visible_gpus,
)
from stitch_graph.execution.export import export_kernelbench
from stitch_graph.execution.files import load_candidate_dir
from stitch_graph.execution.forms import (
    BuildError,
    BuiltProgram,
    arch_matches,
    load_model_class,
    prepare_program,
)
from stitch_graph.execution.isolation import ProcessOutcome, run_isolated, scrub_environment
from stitch_graph.execution.prestart import WarmWorkerPool
from stitch_graph.execution.profiling import profile_candidate, reference_timeline
from stitch_graph.execution.reference import (
    ReferenceData,
    ReferenceFailed,
    compile_baseline,
    ensure_reference,
)
from stitch_graph.execution.round import VerificationOutcome, verify_candidate
from stitch_graph.execution.settings import RunSettings
from stitch_graph.execution.timing import time_cuda

__all__ = [
    "BuildError",
    "BuiltProgram",
    "Executor",
    "Job",
    "JobResult",
    "LocalGPUExecutor",
    "ProcessOutcome",
    "ReferenceData",
    "ReferenceFailed",
    "RunSettings",
    "VerificationOutcome",
    "WarmWorkerPool",
    "aliases_any",
    "arch_matches",
    "compare_output",
    "compile_baseline",
    "ensure_reference",
    "export_kernelbench",
    "flatten_outputs",
    "gpu_available",
    "load_candidate_dir",
    "load_model_class",
    "merge_checks",
    "prepare_program",
    "profile_candidate",
    "reference_timeline",
    "run_isolated",
    "run_job",
    "scrub_environment",
    "summarize_checks",
    "time_cuda",
    "tune_candidate",
    "verify_candidate",
    "visible_gpus",
]


def __getattr__(name: str) -> Any:
    """``tune_candidate`` on first use: tuning needs the code generator, and with it torch,
    which the rest of this package imports only when a job runs."""
    if name == "tune_candidate":
        from stitch_graph.execution.autotune import tune_candidate

        return tune_candidate
    msg = f"module 'stitch_graph.execution' has no attribute {name!r}"
    raise AttributeError(msg)
