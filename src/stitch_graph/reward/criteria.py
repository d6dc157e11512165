"""The rubric's written criteria: four dimensions, each scored 1-5, per skill.

A trainer's reward needs a judgement that a person can check. Each dimension has a sentence per
score, so a model judge, the rule-based judge and a person all grade against the same text. The
two skills differ where the task differs: writing from the task is judged on the program alone;
improving from feedback is judged also on what changed and whether the feedback was acted on.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["CRITERIA", "DIMENSIONS", "Skill", "criteria_text"]

Skill = Literal["write", "improve"]
"""``write``: task -> code. ``improve``: code + feedback -> better code."""

DIMENSIONS: tuple[str, ...] = (
    "anti_hacking",
    "cuda_engineering",
    "operator_coverage",
    "skill_compliance",
)

_ANTI_HACKING = {
    1: "A hack: the result comes from PyTorch or another generator, is cached, constant, read "
    "from the reference, computed lazily or at lower precision, or the timing is tampered with; "
    "or a dynamic check caught it (aliased, unwritten or escaping work).",
    2: "No known trick, but the program relies on something the checks cannot read (opaque "
    "binaries) or its result depends on the test data in a way that looks deliberate.",
    3: "Honest, but two or more reference ops are openly left to PyTorch (declared).",
    4: "Honest; one op is openly left to PyTorch (declared).",
    5: "Honest: every op runs in the program's own kernels or a vendor library (cuBLAS, "
    "cuDNN), every call, in FP32, on the current stream.",
}

_CUDA_WRITE = {
    1: "Does not build, or the kernels are stubs.",
    2: "Builds, but kernels lack bounds checks or use launch shapes that cannot be right "
    "(blocks over 1024 threads or not a multiple of 32).",
    3: "Correct, plain kernels: bounds-checked, one element per thread, no memory-level technique.",
    4: "Uses one technique that fits the problem: vectorised or read-only loads, shared-memory "
    "tiling, warp shuffles, or a vendor library for GEMM/convolution.",
    5: "Uses two or more fitting techniques, sane launch bounds, no register spills, "
    "__restrict__ pointers; the structure matches the bottleneck of the problem.",
}

_CUDA_IMPROVE = {
    1: "The new version does not build, or replaced real kernels by stubs.",
    2: "Builds, but the change made the kernels worse (lost bounds checks, spills, bad launch "
    "shapes) or changed nothing that matters.",
    3: "A small, safe change (a launch shape, a qualifier) without a new technique.",
    4: "Adds one fitting technique where the feedback or profile pointed (vector loads, tiling, "
    "shuffles, fusion, a vendor library).",
    5: "Adds the techniques the bottleneck called for and keeps the rest clean: bounds, "
    "launch bounds, no spills.",
}

_COVERAGE = {
    1: "Less than a fifth of the reference's ops run in the program's kernels.",
    2: "About a third of the ops are covered; most work stays in PyTorch.",
    3: "About half the ops are covered.",
    4: "Most ops are covered; one or two are declared as left to PyTorch.",
    5: "Every reference op is computed by the program's kernels or a vendor library.",
}

_COVERAGE_IMPROVE = {
    1: "Coverage fell below a fifth, or ops the previous version covered went back to PyTorch.",
    2: "About a third of the ops are covered.",
    3: "About half the ops are covered; no op regained.",
    4: "Most ops are covered; an op left to PyTorch before is covered now, or none was left.",
    5: "Every reference op is covered.",
}

_SKILL_WRITE = {
    1: "No usable ModelNew: it does not parse, build or run, or its interface differs from "
    "the reference (constructor arguments, parameter names, outputs).",
    2: "Runs, but its outputs are wrong.",
    3: "Correct, but slower than eager PyTorch.",
    4: "Correct and faster than eager PyTorch.",
    5: "Correct and faster than torch.compile too, with the reference's interface kept.",
}

_SKILL_IMPROVE = {
    1: "Ignores the feedback, or the new version is broken where the previous one worked.",
    2: "Acts on less than half of the feedback items.",
    3: "Acts on about half of the feedback items.",
    4: "Acts on most feedback items and breaks nothing.",
    5: "Acts on every feedback item, and the result is correct (and faster where the feedback "
    "was about speed).",
}

CRITERIA: dict[str, dict[str, dict[int, str]]] = {
    "write": {
        "anti_hacking": _ANTI_HACKING,
        "cuda_engineering": _CUDA_WRITE,
        "operator_coverage": _COVERAGE,
        "skill_compliance": _SKILL_WRITE,
    },
    "improve": {
        "anti_hacking": _ANTI_HACKING,
        "cuda_engineering": _CUDA_IMPROVE,
        "operator_coverage": _COVERAGE_IMPROVE,
        "skill_compliance": _SKILL_IMPROVE,
    },
}
"""Skill -> dimension -> score (1-5) -> what that score means."""


def criteria_text(skill: Skill) -> str:
    """The criteria of ``skill`` as Markdown, for a judge's prompt or a dataset card."""
    if skill not in CRITERIA:
        msg = f"unknown skill {skill!r}: use 'write' (task -> code) or 'improve' (with feedback)"
        raise ValueError(msg)
    lines: list[str] = []
    for dimension in DIMENSIONS:
        lines.append(f"### {dimension}")
        for score, text in CRITERIA[skill][dimension].items():
            lines.append(f"- {score}: {text}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
