"""Typed artefacts that flow between the Planner, Coder and Verifier.

Every artefact is a pydantic model so it validates on the way in, serialises into checkpoints and
shows up readably in LangGraph Studio. The graph state (``state.py``) only holds these.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, Field

# --------------------------------------------------------------------------------------------
# The task


class TensorSpec(BaseModel):
    """Shape and dtype of one tensor the reference takes or returns."""

    shape: list[int]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


class Task(BaseModel):
    """A KernelBench-format problem: the reference program and how it is called."""

    name: str
    source: str = Field(description="Text of the problem file (defines Model, get_inputs, ...).")
    path: str | None = None
    inputs: list[TensorSpec | None] = Field(
        default_factory=list, description="Forward arguments; None for a non-tensor argument."
    )
    input_values: list[Any] = Field(
        default_factory=list, description="Non-tensor forward arguments by position, else None."
    )
    init_args: list[Any] = Field(default_factory=list, description="get_init_inputs(), JSON-safe.")
    outputs: list[TensorSpec] = Field(default_factory=list)
    parameter_count: int = 0
    varying_inputs: list[int] = Field(
        default_factory=list,
        description="Positions of tensor arguments whose shape differed between two draws of "
        "get_inputs() (bags of random lengths): a program specialised to one draw's shapes "
        "checks them and refuses others.",
    )

    @property
    def digest(self) -> str:
        """Content hash of the problem source, used as a cache key."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# The plan


class TodoItem(BaseModel):
    """One step of the plan: usually one kernel, or a host-side change."""

    id: str
    kernel: str = Field(description="Name of the kernel (or host step) this item produces.")
    ops: list[str] = Field(default_factory=list, description="Reference ops this item covers.")
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    fusion: str = Field(default="", description="What is fused and why; where boundaries fall.")
    constraints: list[str] = Field(default_factory=list)
    kind: Literal["pointwise", "reduction", "norm", "gemm", "conv", "host", "other"] = "other"
    stages: list[list[str]] = Field(
        default_factory=list,
        description="A staged reduction's anchors, stage by stage, the first first (empty for "
        "one pass).",
    )
    status: Literal["pending", "done", "failed"] = "pending"
    note: str = ""


class HostPlan(BaseModel):
    """Host-side decisions: buffers, launches, graphs, streams."""

    buffer_reuse: list[str] = Field(default_factory=list)
    cuda_graph: bool = False
    streams: int = 1
    notes: list[str] = Field(default_factory=list)


class Hotspot(BaseModel):
    """One op of the reference timeline."""

    op: str
    cuda_time_us: float = 0.0
    share: float = 0.0
    launches: int = 0


class Plan(BaseModel):
    """The Planner's to-do list for the Coder."""

    summary: str = ""
    items: list[TodoItem] = Field(default_factory=list)
    host: HostPlan = Field(default_factory=HostPlan)
    unsupported_ops: list[str] = Field(
        default_factory=list, description="Ops no item generates; they stay in PyTorch, declared."
    )
    hotspots: list[Hotspot] = Field(default_factory=list)
    exact_order: bool = Field(
        default=False,
        description="Every sum adds its terms in the reference's order: no rewrite that trades "
        "rounding for speed (set once a reordered program missed the tolerance).",
    )
    revision: int = 0
    author: str = "rules"

    def next_pending(self) -> TodoItem | None:
        """The first item not yet done or failed."""
        return next((i for i in self.items if i.status == "pending"), None)


# --------------------------------------------------------------------------------------------
# The candidate program


ProgramForm = Literal["nvrtc", "nvcc_shared", "external"]


class Candidate(BaseModel):
    """A candidate program: CUDA kernels plus Python host code that defines ``ModelNew``.

    ``kernel_source`` is one CUDA C++ translation unit whose launchable kernels are
    ``extern "C" __global__``. ``host_source`` is a Python module defining ``ModelNew``; it finds
    the built kernels in the global ``KERNELS`` (form ``nvrtc``) or the loaded shared library in
    ``LIB`` (form ``nvcc_shared``, built from ``host_cpp`` + ``kernel_source``). Form ``external``
    is a KernelBench ``ModelNew`` file written elsewhere: ``host_source`` holds the whole file,
    which builds its own kernels (CuPy, ``load_inline``, ctypes), and nothing is injected.
    """

    kernel_source: str
    host_source: str
    form: ProgramForm = "nvrtc"
    host_cpp: str | None = None
    link_libraries: list[str] = Field(default_factory=list, description="e.g. cublas, cublasLt")
    declared_torch_ops: list[str] = Field(
        default_factory=list,
        description="Reference ops deliberately left to PyTorch (a partial program).",
    )
    item_id: str | None = None
    item_ids: list[str] = Field(
        default_factory=list,
        description="Every to-do item this program completes when it passes (empty: item_id).",
    )
    author: str = "rules"
    notes: str = ""

    @property
    def completes(self) -> list[str]:
        """The to-do items a pass of this program marks done."""
        return list(self.item_ids) or ([self.item_id] if self.item_id else [])

    @property
    def digest(self) -> str:
        """Content hash of everything that defines the program."""
        h = hashlib.sha256()
        for part in (self.form, self.kernel_source, self.host_source, self.host_cpp or ""):
            h.update(part.encode())
            h.update(b"\0")
        h.update(",".join(self.link_libraries).encode())
        return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Verifier results


class Diagnostic(BaseModel):
    """One compiler message."""

    file: str = ""
    line: int | None = None
    column: int | None = None
    severity: Literal["error", "warning", "note", "info"] = "error"
    message: str


class KernelResources(BaseModel):
    """What ptxas reports for one kernel."""

    kernel: str
    registers: int = 0
    spill_stores_bytes: int = 0
    spill_loads_bytes: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    constant_bytes: int = 0


class CompileResult(BaseModel):
    """Outcome of building a candidate."""

    ok: bool
    arch: str = ""
    command: list[str] = Field(default_factory=list)
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    resources: list[KernelResources] = Field(default_factory=list)
    log: str = ""
    seconds: float = 0.0
    artifact: str | None = Field(default=None, description="Path of the built cubin or library.")
    cached: bool = False

    @property
    def errors(self) -> list[Diagnostic]:
        """Error diagnostics only."""
        return [d for d in self.diagnostics if d.severity == "error"]


RunStatus = Literal["passed", "failed", "error", "not_run"]


class OutputCheck(BaseModel):
    """Comparison of one output tensor against the reference."""

    index: int
    shape_ok: bool = True
    dtype_ok: bool = True
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatch_fraction: float = 0.0
    nonfinite_ok: bool = True
    aliases_input: bool = False
    unwritten: bool = False
    unjoined: bool = False  # not complete on the current stream when the call returned


FailedSide = Literal["candidate", "reference"]


class TestResult(BaseModel):
    """Correctness of a candidate on fresh random inputs.

    ``failed_side`` says whose run a ``failed`` or ``error`` status is about. It is
    ``"reference"`` only when the reference itself could not run: then no candidate can be judged,
    and retrying with another one is pointless.
    """

    __test__ = False  # not a pytest test class

    status: RunStatus
    reason: str = ""
    failed_side: FailedSide = Field(
        default="candidate",
        description="Whose run a failed or error status is about; 'reference': the reference's.",
    )
    trials: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    outputs: list[OutputCheck] = Field(default_factory=list)

    @property
    def reference_failed(self) -> bool:
        """Whether the reference, not the candidate, could not run."""
        return self.status == "error" and self.failed_side == "reference"


class TimingResult(BaseModel):
    """Median times of the candidate, PyTorch eager and torch.compile, one run, one machine."""

    status: RunStatus
    reason: str = ""
    device: str = ""
    runs: int = 0
    candidate_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None

    @property
    def speedup_vs_eager(self) -> float | None:
        """Eager time over candidate time."""
        if self.candidate_ms and self.eager_ms:
            return self.eager_ms / self.candidate_ms
        return None

    @property
    def speedup_vs_compile(self) -> float | None:
        """torch.compile time over candidate time."""
        if self.candidate_ms and self.compile_ms:
            return self.compile_ms / self.candidate_ms
        return None


Bottleneck = Literal["memory", "compute", "latency", "launch", "unknown"]


class KernelMetrics(BaseModel):
    """Per-kernel profile figures (ncu)."""

    name: str
    duration_us: float | None = None
    dram_pct: float | None = Field(default=None, description="DRAM throughput, % of peak.")
    sm_pct: float | None = Field(default=None, description="Compute (SM) throughput, % of peak.")
    memory_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    registers_per_thread: int | None = None
    block_size: int | None = None
    grid_size: int | None = None
    bottleneck: Bottleneck = "unknown"
    metrics: dict[str, float] = Field(default_factory=dict)


class ProfileReport(BaseModel):
    """What the profilers found: per-kernel metrics, the reference timeline, the bottleneck."""

    status: RunStatus = "not_run"
    reason: str = ""
    source: str = ""
    kernels: list[KernelMetrics] = Field(default_factory=list)
    hotspots: list[Hotspot] = Field(default_factory=list)
    bottleneck: Bottleneck = "unknown"
    headroom: float = Field(
        default=0.0, description="Estimated fraction of time that could still be saved (0..1)."
    )


class HackFinding(BaseModel):
    """A reason to distrust a candidate, found by static checks."""

    rule: str
    detail: str
    line: int | None = None


class HackReport(BaseModel):
    """What the static checks found in one candidate.

    ``findings`` are reasons to refuse the candidate; ``declared_uses`` are the PyTorch ops it
    openly leaves to PyTorch (bare names), and ``notes`` describe where they are used.
    """

    findings: list[HackFinding] = Field(default_factory=list)
    declared_uses: list[str] = Field(default_factory=list)
    notes: list[HackFinding] = Field(default_factory=list)

    @property
    def rejected(self) -> bool:
        """Whether any finding should keep the candidate from running or scoring."""
        return bool(self.findings)

    @property
    def rules(self) -> list[str]:
        """The distinct rules that fired, sorted."""
        return sorted({f.rule for f in self.findings})


FeedbackCategory = Literal[
    "compile_error",
    "wrong_result",
    "runtime_error",
    "hack",
    "bottleneck",
    "tuned",
    "item_done",
    "done",
]


class FeedbackItem(BaseModel):
    """One concrete thing to change."""

    action: str = Field(description="Short verb phrase, e.g. 'vectorize loads', 'fix error'.")
    detail: str = ""
    source: str = Field(default="", description="Where it came from: nvcc, ncu, knowledge, ...")


class Feedback(BaseModel):
    """The Verifier's verdict and who acts on it next."""

    target: Literal["coder", "planner", "finalize"]
    category: FeedbackCategory
    summary: str = ""
    items: list[FeedbackItem] = Field(default_factory=list)


class RoundRecord(BaseModel):
    """One generate-compile-test-profile round, for the history."""

    round: int
    item_id: str | None = None
    candidate_digest: str = ""
    author: str = ""
    compiled: bool = False
    test: RunStatus = "not_run"
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    feedback: FeedbackCategory | None = None
    summary: str = ""
    seconds: float = 0.0
    steps: dict[str, float] = Field(
        default_factory=dict,
        description="Seconds of the Verifier's steps: checks, build, test, profile, tuning.",
    )


class BestProgram(BaseModel):
    """The best correct program seen so far."""

    round: int
    candidate: Candidate
    test: TestResult
    timing: TimingResult | None = None
    covered_ops: list[str] = Field(default_factory=list)
    declared_torch_ops: list[str] = Field(default_factory=list)


class AgentFailure(BaseModel):
    """A model-driven agent that could not produce valid output within its retries."""

    agent: str
    reason: str
    attempts: int = 0


class KernelChoice(BaseModel):
    """What tuning chose for one kernel (or ``"program"`` for CUDA-graph replay)."""

    item: str
    kind: str
    setting: dict[str, Any] = Field(description="The knobs that differ from the defaults.")
    tried: int = Field(description="Distinct programs timed for this kernel (0: from the cache).")
    base_ms: float | None = None
    best_ms: float | None = None
    cached: bool = False
    copies: int = Field(
        default=1, description="Kernels that took this setting: the item and its exact copies."
    )


class TuningReport(BaseModel):
    """How long tuning took, what it chose, and on what machine."""

    seconds: float = 0.0
    device: str = ""
    choices: list[KernelChoice] = Field(default_factory=list)
    base_ms: float | None = None
    best_ms: float | None = None
    note: str = ""

    @property
    def speedup(self) -> float | None:
        """Time before tuning over time after, where both were measured."""
        return self.base_ms / self.best_ms if self.base_ms and self.best_ms else None


class RunReport(BaseModel):
    """What finalize writes: the outcome of the whole run."""

    task: str
    outcome: Literal["verified", "compiled_only", "partial", "unsupported", "no_program", "failed"]
    rounds: int = 0
    best: BestProgram | None = None
    summary: str = ""
    details: dict[str, Any] = Field(default_factory=dict)
