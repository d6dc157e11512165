"""Candidates written elsewhere: a KernelBench ``ModelNew`` file as a :class:`Candidate`.

Another agent system, a person or a policy in training writes one Python file that defines
``ModelNew`` and builds its own kernels (CuPy ``RawKernel``/``RawModule``,
``torch.utils.cpp_extension.load_inline``, a ctypes library built with nvcc). Such a file is the
program form ``external``: its whole text is the host source, nothing is injected, and the worker
builds it by executing it, exactly as KernelBench's evaluator does. A folder in the project's own
layout (``host.py``, ``candidate.json``, ``kernel.cu``) is read as the form it names, and this
version's own KernelBench export of the problem as the program it embeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Candidate, Task
from stitch_graph.execution.executor import Executor
from stitch_graph.execution.export import embedded_candidate
from stitch_graph.execution.files import load_candidate_dir
from stitch_graph.execution.prebuild import BuildOutcome, prebuild_external
from stitch_graph.execution.round import VerificationOutcome, verify_candidate
from stitch_graph.execution.settings import RunSettings

__all__ = [
    "CandidateInputError",
    "GPUVerifier",
    "external_candidate",
    "gpu_verifier",
    "read_candidate",
]


class CandidateInputError(ValueError):
    """The path does not hold a candidate this project can read; the message says what to pass."""


def external_candidate(source: str, *, notes: str = "") -> Candidate:
    """A KernelBench ``ModelNew`` file's text as a candidate of form ``external``.

    Args:
        source: The file's text.
        notes: Free text kept with the candidate (where it came from).

    Returns:
        The candidate; its kernels are whatever the file builds.
    """
    return Candidate(
        kernel_source="", host_source=source, form="external", author="external", notes=notes
    )


def _run_folder_candidate(folder: Path) -> Candidate:
    """The program a run folder holds (``program.cu`` + ``host.py``, launched via KERNELS)."""
    host = (folder / "host.py").read_text()
    if "LIB." in host and "KERNELS." not in host:
        msg = (
            f"{folder} holds an nvcc_shared program without its host C++; pass a candidate "
            "folder with host.cpp and candidate.json instead"
        )
        raise CandidateInputError(msg)
    return Candidate(
        kernel_source=(folder / "program.cu").read_text(),
        host_source=host,
        form="nvrtc",
        author="run",
        notes=f"read from the run folder {folder.name}",
    )


def read_candidate(path: str | Path, task: Task | None = None) -> Candidate:
    """Read a candidate from a KernelBench ``ModelNew`` file or a project candidate folder.

    Args:
        path: A ``.py`` file (form ``external``), a folder with ``host.py`` and
            ``candidate.json`` (the form it names), or a run folder of ``stitch-graph
            optimize`` (``program.cu`` and ``host.py``, form ``nvrtc``; its ``model_new.py``
            is an export that embeds the reference, so it is not what gets verified).
        task: The problem, when known: a ``.py`` file that is exactly this version's
            export for it gives the program it embeds (``export.embedded_candidate``).

    Returns:
        The candidate.

    Raises:
        CandidateInputError: The path is missing, or is neither such a file nor such a folder.
    """
    where = Path(path)
    if where.is_dir() and (where / "program.cu").is_file() and (where / "host.py").is_file():
        if not (where / "candidate.json").is_file():
            return _run_folder_candidate(where)
    if where.is_dir():
        if not (where / "host.py").is_file() or not (where / "candidate.json").is_file():
            msg = (
                f"{where} is a folder without host.py and candidate.json (or program.cu); pass a "
                "KernelBench ModelNew .py file, a candidate folder or a run folder"
            )
            raise CandidateInputError(msg)
        try:
            candidate, _ = load_candidate_dir(where)
        except (OSError, ValueError) as exc:
            msg = f"cannot read the candidate folder {where}: {exc}; fix candidate.json"
            raise CandidateInputError(msg) from exc
        return candidate
    if not where.is_file():
        msg = f"no candidate at {where}: pass the path of a KernelBench ModelNew .py file"
        raise CandidateInputError(msg)
    if where.suffix != ".py":
        msg = f"{where} is not a Python file: pass the KernelBench ModelNew .py file"
        raise CandidateInputError(msg)
    try:
        text = where.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read {where}: {exc}; pass a readable UTF-8 Python file"
        raise CandidateInputError(msg) from exc
    embedded = embedded_candidate(text, task) if task is not None else None
    return embedded or external_candidate(text, notes=f"read from {where.name}")


class GPUVerifier:
    """The Verifier's protocol as a plain callable, for reward functions and scripts.

    ``verify(task, candidate) -> VerificationOutcome``; without a GPU every outcome is
    ``not_run``. Calls from several threads share the executor, so a batch spreads over the
    machine's GPUs. ``prebuild(candidates)`` first builds, several at once and off the GPU, the
    extensions that external files build with ``load_inline``.
    """

    def __init__(self, settings: Any = None, executor: Executor | None = None) -> None:
        self.settings = settings
        self.executor = executor

    def __call__(self, task: Task, candidate: Candidate) -> VerificationOutcome:
        return verify_candidate(task, candidate, self.settings, executor=self.executor)

    def prebuild(self, candidates: list[Candidate], *, jobs: int = 4) -> list[BuildOutcome]:
        """Build the candidates' own extensions where their candidate workers will look."""
        return prebuild_external(candidates, RunSettings.from_context(self.settings), jobs=jobs)


def gpu_verifier(settings: Any = None, *, executor: Executor | None = None) -> GPUVerifier:
    """The Verifier's protocol as a plain callable (:class:`GPUVerifier`).

    Args:
        settings: ``RunSettings``, ``StitchContext`` or None (defaults).
        executor: Where candidates run; the process-wide GPU executor when None.

    Returns:
        ``verify(task, candidate) -> VerificationOutcome``, with ``verify.prebuild``.
    """
    return GPUVerifier(settings, executor)
