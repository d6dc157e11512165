"""Worker process entry point: ``python -m stitch_graph.execution.worker JOB.json``.

Each job runs in a process of its own so a crash, hang or poisoned CUDA context ends with the
process and never reaches the parent. The worker reads the job, runs the handler of its kind, writes
``result.json`` next to the job file, and leaves with ``os._exit`` (a CUDA context broken by an
illegal access can hang ordinary interpreter teardown). Python-level failures become a structured
``{"error": {...}}`` result; anything worse is diagnosed by the parent from the exit status.

``python -m stitch_graph.execution.worker --prestarted`` is the same worker started ahead of its
job (see ``stitch_graph.execution.prestart``): it imports what jobs need without creating a CUDA
context, writes a ``ready`` marker into its folder, and reads one line from stdin, the job file's
path. It then takes on what a cold worker of that job would have had -- working directory, TMPDIR,
``sys.path[0]``, stdout and stderr in the scratch folder, stdin from ``/dev/null`` -- and runs the
job exactly like a cold worker. End-of-file instead of a path (the parent went away) exits quietly.

This module is the top of the package's worker side: ``HANDLERS``, the dispatch table from job
kind to handler, imports the handlers of ``candidate``, ``prebuild``, ``reference`` and
``profiling`` (and ``autotune`` when a tuning job arrives), and none of them imports this module
back.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stitch_graph.execution._common import describe_exception
from stitch_graph.execution.candidate import run_candidate_job
from stitch_graph.execution.prebuild import run_build_job
from stitch_graph.execution.prestart import READY_FILE
from stitch_graph.execution.profiling import run_runner_job
from stitch_graph.execution.reference import run_reference_job, run_warmup_job

__all__ = ["HANDLERS", "PRELOAD", "main", "run_probe_job"]

PRELOAD = ("numpy", "torch", "cupy")
"""Libraries a pre-started worker imports while it waits; none of them initialises CUDA.

The job handlers' own modules are imported with this one, so they need no entry here.
"""

Handler = Callable[[dict[str, Any], Path], dict[str, Any]]


def run_probe_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``probe`` jobs: import torch and describe the process, nothing else.

    Used to check a worker's start-up (how long importing torch took here, whether CUDA was already
    initialised, where it runs); ``payload`` is ignored.
    """
    start = time.perf_counter()
    import torch

    import_s = time.perf_counter() - start
    return {
        "import_s": import_s,
        "torch": torch.__version__,
        "cuda_initialized": bool(torch.cuda.is_initialized()),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "tmpdir": tempfile.gettempdir(),
        "sys_path0": sys.path[0] if sys.path else "",
        "env_names": sorted(os.environ),
        "scratch": str(scratch),
    }


def run_tuning_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``tune`` jobs (``execution.autotune``), imported when one arrives: the
    tuner needs the code generator, which imports torch and fx, and every other job's worker
    should start without them."""
    from stitch_graph.execution.autotune import run_tuning_job as tune

    return tune(payload, scratch)


HANDLERS: dict[str, Handler] = {
    "build": run_build_job,
    "candidate": run_candidate_job,
    "probe": run_probe_job,
    "reference": run_reference_job,
    "runner": run_runner_job,
    "tune": run_tuning_job,
    "warmup": run_warmup_job,
}
"""The worker's dispatch table: the handler of each job kind."""


def _handler(kind: str) -> Handler:
    """The handler of ``kind``; an unknown kind is an error of the job, not of the worker."""
    handler = HANDLERS.get(kind)
    if handler is None:
        msg = f"unknown job kind {kind!r}"
        raise ValueError(msg)
    return handler


def _write_result(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, path)


def _preload() -> None:
    """Import ``PRELOAD``; a module that fails is left for the job to meet in its own words."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - e.g. no CuPy on this machine
            pass


def _await_job() -> Path | None:
    """Preload, say ready, wait for the job file's path on stdin and adopt its scratch folder.

    Returns:
        The job file, or ``None`` on end-of-file (no job will come).
    """
    home = Path.cwd()
    _preload()
    try:
        (home / READY_FILE).write_text(str(os.getpid()))
    except OSError:
        pass
    line = sys.stdin.readline().strip()
    if not line:
        return None
    job_path = Path(line).resolve()
    _adopt(job_path.parent, home)
    return job_path


def _adopt(scratch: Path, home: Path) -> None:
    """Make this process look like a cold worker started in ``scratch``.

    Args:
        scratch: The job's scratch folder.
        home: The folder the worker was started in (its logs while idle).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        target = scratch / name
        try:
            earlier = (home / name).read_bytes()  # e.g. warnings printed while importing
        except OSError:
            earlier = b""
        target.write_bytes(earlier)
        new = os.open(target, os.O_WRONLY | os.O_APPEND)
        os.dup2(new, fd)
        os.close(new)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(scratch)
    if sys.path and sys.path[0] == str(home):
        sys.path[0] = str(scratch)
    if "TMPDIR" not in os.environ:  # a cold worker gets its scratch folder as TMPDIR
        os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # forget a temp dir looked up while importing


def main(argv: list[str] | None = None) -> int:
    """Run the job file named in ``argv`` and write its result; returns the exit status.

    ``--prestarted`` instead of a job file: preload, then wait for the job file's path on stdin.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files from crashing kernels
    except (ImportError, ValueError, OSError):
        pass
    if len(args) != 1:
        print(
            "usage: python -m stitch_graph.execution.worker JOB.json | --prestarted",
            file=sys.stderr,
        )
        return 2
    if args[0] == "--prestarted":
        waited = _await_job()
        if waited is None:
            return 0
        job_path = waited
    else:
        job_path = Path(args[0]).resolve()
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
