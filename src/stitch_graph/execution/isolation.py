"""Run one command as an isolated, killable child: own process group, timeout, memory watch.

Candidate programs are untrusted and may hang, crash, leak memory or read the environment, so each
runs in a fresh process started in a session of its own. The parent never waits unboundedly: a
wall-clock timeout and a resident-memory limit each kill the whole process group. ``RLIMIT_AS`` is
not used because CUDA reserves terabytes of virtual address space; the parent instead sums the
resident set of every process in the group from ``/proc`` a few times a second. The environment is
scrubbed of anything that looks like a credential before the child sees it. Starting and watching
are separate steps so a worker can be started ahead of time and watched only once it has a job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "ProcessOutcome",
    "group_rss_mb",
    "kill_isolated",
    "run_isolated",
    "scrub_environment",
    "start_isolated",
    "watch_isolated",
]

_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
_SECRET_PREFIXES = ("OPENAI_", "ANTHROPIC_", "AWS_", "HF_", "LANGSMITH_", "LANGCHAIN_")
_TAIL_CHARS = 6000


def scrub_environment(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` without variables that may hold credentials.

    Args:
        env: The environment to copy.

    Returns:
        The environment minus names containing KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL, or
        starting with OPENAI_, ANTHROPIC_, AWS_, HF_, LANGSMITH_ or LANGCHAIN_ (case-insensitive).
    """
    clean: dict[str, str] = {}
    for name, value in env.items():
        upper = name.upper()
        if any(m in upper for m in _SECRET_MARKERS) or upper.startswith(_SECRET_PREFIXES):
            continue
        clean[name] = value
    return clean


@dataclass
class ProcessOutcome:
    """How an isolated process ended."""

    returncode: int | None
    seconds: float
    timed_out: bool = False
    memory_exceeded: bool = False
    peak_rss_mb: float = 0.0
    stdout_path: str = ""
    stderr_path: str = ""

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that ended the process, if one did."""
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    def tail(self, which: str = "stderr", chars: int = _TAIL_CHARS) -> str:
        """The last ``chars`` characters of the process's stdout or stderr."""
        path = self.stderr_path if which == "stderr" else self.stdout_path
        if not path or not os.path.exists(path):
            return ""
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chars))
            return fh.read().decode(errors="replace")


def group_rss_mb(pgid: int) -> float:
    """Resident memory of all processes in process group ``pgid``, MiB (0 where unreadable)."""
    page_kb = os.sysconf("SC_PAGE_SIZE") / 1024
    total_kb = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        # fields after the command name, which is in parentheses and may contain spaces
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) < 22 or int(rest[2]) != pgid:
            continue
        total_kb += int(rest[21]) * page_kb  # rss, pages
    return total_kb / 1024


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_isolated(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    stdout: IO[bytes],
    stderr: IO[bytes],
    stdin: IO[bytes] | int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session (and so a process group) of its own, with a scrubbed environment.

    Args:
        argv: Command and arguments.
        cwd: Working folder of the child.
        env: Environment for the child; it is scrubbed of credentials here. ``None``: ours.
        stdout: Where the child's standard output goes.
        stderr: Where the child's standard error goes.
        stdin: The child's standard input (``subprocess.PIPE`` for a pre-started worker).

    Returns:
        The running child; its process group id is its pid.
    """
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=scrub_environment(os.environ if env is None else env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )


def watch_isolated(
    proc: subprocess.Popen[bytes],
    *,
    timeout_s: float = 120.0,
    memory_limit_mb: float | None = None,
    poll_s: float = 0.05,
    stdout_path: str = "",
    stderr_path: str = "",
    start: float | None = None,
) -> ProcessOutcome:
    """Wait for a child from ``start_isolated``; kill its whole group on timeout or memory excess.

    Args:
        proc: The child; its process group id must be its pid.
        timeout_s: Wall-clock limit, seconds, counted from ``start``.
        memory_limit_mb: Resident-memory limit of the process group, MiB; ``None``: none.
        poll_s: How often the child is checked.
        stdout_path: File holding the child's stdout (reported in the outcome).
        stderr_path: File holding the child's stderr (reported in the outcome).
        start: ``time.monotonic()`` when the child's work began; now when ``None``.

    Returns:
        The outcome; the call itself never raises for anything the child does. The group is dead
        when it returns, grandchildren included.
    """
    start = time.monotonic() if start is None else start
    pgid = proc.pid
    outcome = ProcessOutcome(
        returncode=None, seconds=0.0, stdout_path=stdout_path, stderr_path=stderr_path
    )
    next_memory_check = start
    try:
        while True:
            try:
                proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - start > timeout_s:
                outcome.timed_out = True
                _kill_group(pgid)
                proc.wait()
                break
            if memory_limit_mb is not None and now >= next_memory_check:
                next_memory_check = now + 0.1
                rss = group_rss_mb(pgid)
                outcome.peak_rss_mb = max(outcome.peak_rss_mb, rss)
                if rss > memory_limit_mb:
                    outcome.memory_exceeded = True
                    _kill_group(pgid)
                    proc.wait()
                    break
    finally:
        if proc.poll() is None:
            _kill_group(pgid)
            proc.wait()
        _kill_group(pgid)  # grandchildren left behind
    outcome.returncode = proc.returncode
    outcome.seconds = time.monotonic() - start
    return outcome


def kill_isolated(proc: subprocess.Popen[bytes]) -> None:
    """Kill the process group of a child from ``start_isolated`` and reap the child."""
    _kill_group(proc.pid)
    proc.wait()


def run_isolated(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    memory_limit_mb: float | None = None,
    poll_s: float = 0.05,
) -> ProcessOutcome:
    """Run ``argv`` in a new session; kill its whole group on timeout or memory excess.

    Args:
        argv: Command and arguments.
        cwd: Working (scratch) folder; stdout and stderr are written there.
        env: Environment for the child; it is scrubbed of credentials here. ``None``: ours.
        timeout_s: Wall-clock limit, seconds.
        memory_limit_mb: Resident-memory limit of the process group, MiB; ``None``: none.
        poll_s: How often the child is checked.

    Returns:
        The outcome; the call itself never raises for anything the child does.
    """
    folder = Path(cwd)
    folder.mkdir(parents=True, exist_ok=True)
    stdout_path = folder / "stdout.txt"
    stderr_path = folder / "stderr.txt"
    start = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = start_isolated(argv, cwd=folder, env=env, stdout=out, stderr=err)
    return watch_isolated(
        proc,
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        poll_s=poll_s,
        stdout_path=str(stdout_path),
        stderr_path=str(stderr_path),
        start=start,
    )
