"""Pre-started workers: the next job's process, already past its imports, waiting for the job.

A cold worker spends 1.5-3 s importing torch (and CuPy) before it looks at its job, most of a
verification round. So while one job runs, the executor starts the next worker for the same GPU
slot. That process gets the environment a cold worker would get (scrubbed, with the slot's
``CUDA_VISIBLE_DEVICES``), imports NumPy, torch, CuPy and the execution modules -- none of which
creates a CUDA context -- and blocks reading one line from its stdin: the path of a job file. From
the hand-over on it is an ordinary isolated worker (``stitch_graph.execution.worker``): the
timeout and the memory watch start then, and it runs exactly one job and exits. Isolation is the
same as with a cold start because no process ever sees two jobs; all that is shared is the time
spent importing.

A pre-started worker is discarded, and the job started cold, when it died while waiting or was
started with another environment than the job needs. Idle workers are killed by ``close()``, when
the pool is garbage-collected, and at interpreter exit; should the parent die without any of those,
the worker reads end-of-file on its stdin and exits by itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stitch_graph.execution.isolation import kill_isolated, scrub_environment, start_isolated

__all__ = ["READY_FILE", "WarmWorker", "WarmWorkerPool", "prestart_argv"]

READY_FILE = "ready"
"""Written into its own folder by a pre-started worker once its imports are done."""


def prestart_argv() -> list[str]:
    """``python -m stitch_graph.execution.worker --prestarted`` with fault tracebacks on."""
    return [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "stitch_graph.execution.worker",
        "--prestarted",
    ]


@dataclass
class WarmWorker:
    """One pre-started worker process, idle until it is handed a job.

    Attributes:
        proc: The process; a session and process group of its own, stdin a pipe.
        slot: The GPU slot (``CUDA_VISIBLE_DEVICES`` value) it was started for.
        env: The scrubbed environment it was started with.
        folder: Its own folder: working directory and logs while idle, the ready marker.
        started: ``time.monotonic()`` when it was started.
    """

    proc: subprocess.Popen[bytes]
    slot: str | None
    env: dict[str, str]
    folder: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        """Process id (and process group id) of the worker."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def ready(self) -> bool:
        """Whether the worker finished its imports and waits for a job."""
        return self.alive() and (self.folder / READY_FILE).exists()

    def hand_over(self, job_path: Path) -> bool:
        """Send the job file's path to the worker; from now on it runs that job.

        Args:
            job_path: Absolute path of the job file; its folder is the job's scratch folder.

        Returns:
            ``False`` when the worker was gone before it could take the job (nothing was handed
            over; the caller starts the job cold).
        """
        stdin = self.proc.stdin
        if stdin is None or not self.alive():
            return False
        try:
            stdin.write(f"{job_path}\n".encode())
            stdin.close()
        except OSError:  # BrokenPipeError: it died just now
            return False
        return True

    def discard(self) -> None:
        """Kill the worker's process group, reap it and remove its folder."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self.proc.returncode is None:  # not reaped yet, so its pid is not anyone else's
            kill_isolated(self.proc)
        self.remove_folder()

    def remove_folder(self) -> None:
        """Remove the worker's own folder (after its job, or when discarded)."""
        shutil.rmtree(self.folder, ignore_errors=True)


class _Idle:
    """The pool's state, kept apart from the pool so a finalizer can clean it up."""

    def __init__(self) -> None:
        self.workers: dict[str | None, WarmWorker] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.root: Path | None = None
        self.count = 0

    def close(self) -> None:
        with self.lock:
            self.closed = True
            workers = list(self.workers.values())
            self.workers.clear()
            root, self.root = self.root, None
        for worker in workers:
            worker.discard()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


class WarmWorkerPool:
    """At most one idle, pre-started worker per GPU slot.

    ``prepare`` starts one for a slot (the executor calls it when a job starts, so the import time
    overlaps that job); ``take`` hands it out for exactly one job, or returns ``None`` when a cold
    start is needed. Thread-safe; slots are independent.

    Args:
        argv: Command of a pre-started worker; ``prestart_argv()`` when ``None``.
    """

    def __init__(self, argv: list[str] | None = None) -> None:
        self._argv = list(argv) if argv is not None else prestart_argv()
        self._idle = _Idle()
        self._finalizer = weakref.finalize(self, self._idle.close)  # also runs at exit

    def prepare(self, slot: str | None, env: Mapping[str, str]) -> WarmWorker | None:
        """Make sure an idle worker started with ``env`` waits for the next job on ``slot``.

        An idle worker of the slot that is dead or has another environment is replaced.

        Args:
            slot: The GPU slot; ``env`` already holds its ``CUDA_VISIBLE_DEVICES``.
            env: The environment the next job's worker needs (scrubbed here).

        Returns:
            The idle worker of the slot, or ``None`` once the pool is closed.
        """
        clean = scrub_environment(env)
        state = self._idle
        stale: WarmWorker | None = None
        with state.lock:
            if state.closed:
                return None
            current = state.workers.get(slot)
            if current is not None and current.alive() and current.env == clean:
                return current
            stale = state.workers.pop(slot, None)
            if state.root is None:
                state.root = Path(tempfile.mkdtemp(prefix="stitch-prestart-"))
            state.count += 1
            folder = state.root / f"worker-{state.count}"
            folder.mkdir()
            with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
                proc = start_isolated(
                    self._argv, cwd=folder, env=clean, stdout=out, stderr=err, stdin=subprocess.PIPE
                )
            worker = WarmWorker(proc=proc, slot=slot, env=clean, folder=folder)
            state.workers[slot] = worker
        if stale is not None:
            stale.discard()
        return worker

    def take(self, slot: str | None, env: Mapping[str, str]) -> WarmWorker | None:
        """The idle worker of ``slot`` for one job, if it is alive and was started with ``env``.

        The worker leaves the pool either way; one that cannot be used is discarded.

        Args:
            slot: The GPU slot of the job.
            env: The environment the job's worker needs (compared after scrubbing).

        Returns:
            The worker (hand it the job with ``WarmWorker.hand_over``), or ``None``: start cold.
        """
        with self._idle.lock:
            worker = self._idle.workers.pop(slot, None)
        if worker is None:
            return None
        if not worker.alive() or worker.env != scrub_environment(env):
            worker.discard()
            return None
        return worker

    def wait_ready(self, slot: str | None, timeout_s: float = 60.0) -> bool:
        """Block until the idle worker of ``slot`` has finished its imports.

        Args:
            slot: The GPU slot.
            timeout_s: Longest wait, seconds.

        Returns:
            Whether a ready worker waits on ``slot`` (``False`` if there is none, it died, or the
            time ran out).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._idle.lock:
                worker = self._idle.workers.get(slot)
            if worker is None or not worker.alive():
                return False
            if worker.ready():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def idle_pids(self) -> dict[str | None, int]:
        """Process ids of the idle workers, by slot."""
        with self._idle.lock:
            return {slot: w.pid for slot, w in self._idle.workers.items()}

    def close(self) -> None:
        """Kill every idle worker and start no more; workers already handed a job are unaffected."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._idle.closed
