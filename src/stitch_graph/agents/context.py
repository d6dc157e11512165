"""Run settings: a model per role, budgets, target GPU, tolerances.

They live in LangGraph's context schema (``Runtime[StitchContext]``), not in the graph state, so a
checkpoint holds what happened and the settings hold how to run. With no context passed, LangGraph
gives ``runtime.context = None``; ``resolve_context`` applies the defaults then.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel

ModelSpec = str | BaseChatModel | None
StructuredMethod = Literal["function_calling", "json_schema", "json_mode"]


@dataclass(kw_only=True)
class StitchContext:
    """Settings of one run. Every field has a default; ``None`` for a model means rule-based."""

    planner_model: ModelSpec = field(
        default=None,
        metadata={"description": "Planner's chat model: init_chat_model string, model, or None."},
    )
    coder_model: ModelSpec = field(
        default=None,
        metadata={"description": "Coder's chat model: init_chat_model string, model, or None."},
    )
    verifier_model: ModelSpec = field(
        default=None,
        metadata={"description": "Verifier's analysis model; None analyses by rules."},
    )
    structured_output_method: StructuredMethod = field(
        default="function_calling",
        metadata={
            "description": "How structured output is requested; function_calling is the "
            "most portable across OpenAI-compatible servers."
        },
    )
    model_retries: int = field(
        default=2,
        metadata={"description": "Re-asks after malformed model output before failing cleanly."},
    )
    max_tool_calls: int = field(
        default=4,
        metadata={"description": "Tool calls a model-driven agent may make per turn."},
    )
    max_rounds: int = field(
        default=12, metadata={"description": "Coder-Verifier rounds before finalize."}
    )
    max_retries_per_item: int = field(
        default=3, metadata={"description": "Failed attempts at one to-do item before skipping it."}
    )
    max_replans: int = field(
        default=2, metadata={"description": "Times the Planner may revise the plan."}
    )
    wall_time_s: float = field(
        default=1800.0, metadata={"description": "Wall-clock budget of the whole run, seconds."}
    )
    target_speedup: float = field(
        default=0.0,
        metadata={"description": "Stop once speedup over torch.compile reaches this (0: never)."},
    )
    defer_compile_baseline: bool = field(
        default=True,
        metadata={
            "description": "Time torch.compile once, for the report, at the end of the run "
            "(its cold compile runs beside the loop, niced) instead of in the first reference "
            "run, where a whole model's compile held the loop 30-45 s on an H200. Off with "
            "target_speedup, which compares with torch.compile every round."
        },
    )
    min_headroom: float = field(
        default=0.15,
        metadata={"description": "Re-plan only when the profile says at least this much is left."},
    )
    min_replan_gain: float = field(
        default=0.02,
        metadata={
            "description": "Re-plan again only when the last re-plan made the best program at "
            "least this much faster (0.02: 2%)."
        },
    )
    gpu_arch: str = field(
        default="sm_90a", metadata={"description": "nvcc -arch target, e.g. sm_90a for H100/H200."}
    )
    atol: float = field(default=1e-4, metadata={"description": "Absolute tolerance (KernelBench)."})
    rtol: float = field(default=1e-4, metadata={"description": "Relative tolerance (KernelBench)."})
    allow_tf32: bool = field(
        default=False, metadata={"description": "Let both sides use TF32; off judges true FP32."}
    )
    correctness_trials: int = field(
        default=3, metadata={"description": "Fresh random input draws per correctness check."}
    )
    timing_runs: int = field(default=20, metadata={"description": "Timed runs; median reported."})
    warmup_runs: int = field(default=5, metadata={"description": "Untimed runs before timing."})
    use_knowledge: bool = field(
        default=True,
        metadata={"description": "Turn findings into advice from the CUDA knowledge index."},
    )
    profile: bool = field(
        default=True, metadata={"description": "Run ncu on correct candidates when available."}
    )
    autotune: bool = field(
        default=True,
        metadata={
            "description": "Time each generated kernel's tuning space once the rule-based "
            "program is correct, and keep the fastest settings."
        },
    )
    tune_budget_s: float = field(
        default=15.0,
        metadata={
            "description": "Seconds of autotuning per run at most (12 s tuned the StitchCUDA "
            "L3 ten to 2.14x torch.compile on an H200; a warm cache reuses every choice)."
        },
    )
    timeout_s: float = field(
        default=120.0, metadata={"description": "Wall-clock limit of one candidate's worker."}
    )
    memory_limit_mb: int | None = field(
        default=None,
        metadata={
            "description": "Host memory limit of each worker, MiB; None: half of this "
            "machine's memory."
        },
    )
    executor: Any = field(
        default=None,
        metadata={
            "description": "Runs candidates: an object with verify_candidate() and "
            "profile_candidate(), tune_candidate() where it can tune, reference_timeline() "
            "where the Planner's reference run goes and compile_baseline() where the report's "
            "torch.compile time is taken (default: the local GPU worker pool)."
        },
    )
    work_dir: str | None = field(
        default=None, metadata={"description": "Where builds and scratch files go (default: temp)."}
    )
    run_dir: str | None = field(
        default=None,
        metadata={
            "description": "Where finalize writes the run folder (program, ModelNew file, "
            "reports); None: no files, the program is in the result."
        },
    )

    def with_overrides(self, **overrides: Any) -> StitchContext:
        """A copy with some fields changed; unknown names raise ``TypeError``."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            msg = f"unknown setting(s) {unknown}; known settings: {sorted(known)}"
            raise TypeError(msg)
        return replace(self, **overrides)


def resolve_context(context: StitchContext | None) -> StitchContext:
    """The given context, or the defaults when LangGraph passed none."""
    return context if context is not None else StitchContext()
