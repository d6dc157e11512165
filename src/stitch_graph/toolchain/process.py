"""Run a toolkit program (nvcc, ncu) so that a timeout stops everything it started.

The program gets a session of its own; on timeout the whole process group is killed (cicc, ptxas
and gcc under nvcc; the profiled program under ncu), and the output so far is kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ToolRun", "run_tool"]


@dataclass
class ToolRun:
    """What a run produced; ``start_error`` is set when the program could not be started."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    start_error: str | None = None


def run_tool(
    command: Sequence[str],
    *,
    cwd: str | Path | None,
    env: Mapping[str, str],
    timeout_s: float,
    merge_stderr: bool = False,
) -> ToolRun:
    """Run ``command`` in its own session, killing its process group after ``timeout_s``."""
    try:
        proc = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return ToolRun(None, "", "", start_error=str(exc))
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        return ToolRun(proc.returncode, stdout or "", stderr or "")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        stdout, stderr = proc.communicate()
        return ToolRun(proc.returncode, stdout or "", stderr or "", timed_out=True)
