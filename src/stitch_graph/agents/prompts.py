"""System prompts and message builders for the model-driven Planner, Coder and Verifier.

Kept apart from the agents so that prompts can be read, diffed and tuned on their own.
"""

from __future__ import annotations

import json

from stitch_graph.artifacts import (
    Candidate,
    CompileResult,
    Feedback,
    Plan,
    ProfileReport,
    Task,
    TestResult,
    TimingResult,
    TodoItem,
)

PROGRAM_FORMAT = """\
A program has two parts.
1. kernel_source: one CUDA C++ translation unit. Every kernel the host code launches is declared
   `extern "C" __global__`. Use `__restrict__`, bounds checks, 64-bit indices for large tensors.
2. host_source: a Python module defining `class ModelNew(torch.nn.Module)` with the same
   constructor arguments as the reference `Model` and the same parameter/buffer names and shapes
   (the harness loads the reference weights into it). Its forward may only allocate outputs
   (torch.empty / empty_like), take views and shapes, and launch kernels through the global
   `KERNELS`, already defined for you: `KERNELS.my_kernel(grid, block, *args, shared_mem=0)`.
   Tensors are passed as device pointers; Python numbers are converted to the C types of the
   kernel's signature. Kernels run on PyTorch's current stream. Also on `KERNELS`:
   `KERNELS.sgemm(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch)`, a column-major
   cuBLAS SGEMM in true FP32 (strided-batched when batch > 1; ta/tb 1 = transposed),
   `KERNELS.conv(x, w, y, stride, padding, dilation, groups)` and `KERNELS.conv_transpose(...)`
   (same arguments; y's shape gives the output padding), cuDNN convolutions without bias into a
   preallocated contiguous y, in FP32, and
   `return KERNELS.graphed(self, self._launch, *inputs)`, which replays a launch-bound forward
   written as a method `_launch(self, *inputs)` from a CUDA graph.
Any reference op you leave to PyTorch must be listed in declared_torch_ops (a partial program is
reported as partial). Computing with undeclared torch ops, caching outputs between calls,
returning constants, branching on input values, calling torch.compile/Triton or reading the
reference module are rejected as reward hacks. Correctness is checked in true FP32 against the
reference at atol=rtol=1e-4 on several random inputs; do not downcast to FP16/TF32."""

PLANNER_SYSTEM = f"""\
You are the Planner of a team that rewrites a PyTorch program as fast, correct CUDA.
Read the reference program and its profile, then write an ordered to-do list for the Coder:
one item per kernel (or host-side step), naming the reference ops it covers, the tensor shapes,
the fusion strategy (what is fused, where the boundaries fall and why) and constraints
(vectorisation, reductions, numerics). Put the most expensive work first. Library calls
(cuBLAS for GEMM, cuDNN for convolution) are legitimate. Add a host plan: buffer reuse,
CUDA-graph capture when the program is launch-bound, streams. Name ops that cannot be generated
as unsupported_ops.
When re-planning after a profile, change what the bottleneck calls for and keep what works.

{PROGRAM_FORMAT}"""

CODER_SYSTEM = f"""\
You are the Coder of a team that rewrites a PyTorch program as fast, correct CUDA.
Work on the to-do item you are given, extending the previous program (keep items already done).
You may call `nvcc_compile` on a draft of kernel_source to see real compiler errors and register
/ spill counts before you hand it over, and `search_cuda_knowledge` for optimisation advice.
When the draft is ready, answer with the complete program.

{PROGRAM_FORMAT}"""

VERIFIER_SYSTEM = """\
You are the Verifier of a team that rewrites a PyTorch program as fast, correct CUDA.
The candidate below compiled and matched the reference. Find its bottleneck: you may call
`ncu_profile` for hardware counters of its kernels, `timeline_profile` for the reference's
per-op timeline, and `search_cuda_knowledge` for advice. Then give concrete, actionable feedback
items (what to change and why, with the numbers that show it)."""


def _json(model: object) -> str:
    return json.dumps(model, indent=1, default=str)


def describe_feedback(feedback: Feedback) -> str:
    """Verifier feedback as plain lines (compiler messages stay readable, unescaped)."""
    lines = [f"[{feedback.category}] {feedback.summary}"]
    lines += [f"- {i.action}: {i.detail} ({i.source})" for i in feedback.items]
    return "\n".join(lines)


def describe_task(task: Task) -> str:
    """The reference program and its tensor shapes as a prompt section."""
    inputs = [f"{s.shape} {s.dtype}" if s else "scalar" for s in task.inputs]
    outputs = [f"{s.shape} {s.dtype}" for s in task.outputs]
    return (
        f"Reference program `{task.name}`:\n```python\n{task.source}\n```\n"
        f"Forward inputs: {inputs}\nOutputs: {outputs}\nInit args: {task.init_args}"
    )


def planner_request(
    task: Task,
    *,
    previous: Plan | None,
    feedback: Feedback | None,
    profile: ProfileReport | None,
    graph_ops: list[str] | None = None,
) -> str:
    """The Planner's user message."""
    parts = [describe_task(task)]
    if graph_ops:
        parts.append(
            "The reference as a graph of ops (name = op(shape)); name ops in your items by these "
            "names so any Coder, the rule-based one included, can follow the plan:\n"
            + "\n".join(graph_ops)
        )
    if profile is not None and profile.hotspots:
        parts.append(
            "Reference timeline hotspots:\n" + _json([h.model_dump() for h in profile.hotspots])
        )
    if previous is not None:
        parts.append("Previous plan:\n" + previous.model_dump_json(indent=1))
    if feedback is not None:
        parts.append("Verifier feedback to act on:\n" + describe_feedback(feedback))
    parts.append("Write the plan.")
    return "\n\n".join(parts)


def coder_request(
    task: Task,
    plan: Plan,
    item: TodoItem,
    *,
    previous: Candidate | None,
    feedback: Feedback | None,
) -> str:
    """The Coder's user message for one to-do item."""
    parts = [describe_task(task), "Plan:\n" + plan.model_dump_json(indent=1)]
    parts.append(f"Your item now: {item.id} ({item.kernel}).")
    if previous is not None:
        parts.append(
            "Previous program:\n```cuda\n"
            + previous.kernel_source
            + "\n```\n```python\n"
            + previous.host_source
            + "\n```\nDeclared torch ops: "
            + ", ".join(previous.declared_torch_ops)
        )
    if feedback is not None:
        parts.append("Feedback on the previous attempt:\n" + describe_feedback(feedback))
    return "\n\n".join(parts)


def verifier_request(
    task: Task,
    candidate: Candidate,
    compiled: CompileResult,
    test: TestResult,
    timing: TimingResult | None,
) -> str:
    """The Verifier's user message for analysing a correct candidate."""
    resources = _json([r.model_dump() for r in compiled.resources])
    timing_text = timing.model_dump_json() if timing is not None else "not measured"
    return (
        f"{describe_task(task)}\n\nCandidate kernels:\n```cuda\n{candidate.kernel_source}\n```\n"
        f"Host code:\n```python\n{candidate.host_source}\n```\n"
        f"ptxas resources: {resources}\nTest: {test.status}\nTiming: {timing_text}"
    )
