"""The rubric half of the StitchCUDA reward: four criteria scored from static signals.

Speedup alone rewards any trick that makes a program fast; the rubric adds a judgement of how the
program was written. Each criterion is a number in [0, 1] computed from things we can see without
running anything more: the hack report, the kernel text, the compiler's resource report, the ops
the candidate covers, and for an "improve from feedback" sample, whether the new candidate visibly
acts on the feedback it was given. The heuristics are deliberately simple and documented per
function so that a trainer knows what is being rewarded.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from stitch_graph.artifacts import Candidate, CompileResult, FeedbackItem, HackReport
from stitch_graph.checks import HACK_RULES
from stitch_graph.checks.opnames import op_keys

__all__ = [
    "DECLARED_USE_PENALTY",
    "RubricScores",
    "launch_configs",
    "score_anti_hacking",
    "score_coverage",
    "score_cuda_engineering",
    "score_rubric",
    "score_skill_compliance",
]

DECLARED_USE_PENALTY = 0.1
"""Anti-hacking points lost per op left to PyTorch (declared), down to a floor of 0.5."""

_DECLARED_FLOOR = 0.5


class RubricScores(BaseModel):
    """The four rubric criteria, each in [0, 1], with notes on how they were reached."""

    anti_hacking: float = Field(ge=0.0, le=1.0)
    cuda_engineering: float = Field(ge=0.0, le=1.0)
    coverage: float = Field(ge=0.0, le=1.0)
    skill_compliance: float = Field(ge=0.0, le=1.0)
    notes: list[str] = Field(default_factory=list)

    @property
    def mean(self) -> float:
        """The rubric score r: the mean of the four criteria."""
        parts = (self.anti_hacking, self.cuda_engineering, self.coverage, self.skill_compliance)
        return sum(parts) / len(parts)


# ------------------------------------------------------------------------------------------
# Anti-hacking


def score_anti_hacking(hack_report: HackReport) -> tuple[float, list[str]]:
    """0 when the hack checks reject the candidate, else 1 minus a penalty per declared op.

    Args:
        hack_report: Result of :func:`stitch_graph.checks.check_candidate`.

    Returns:
        The score and notes explaining it.
    """
    if hack_report.rejected:
        return 0.0, [f"anti_hacking: rejected ({', '.join(hack_report.rules)})"]
    declared = len(hack_report.declared_uses)
    score = max(_DECLARED_FLOOR, 1.0 - DECLARED_USE_PENALTY * declared)
    notes = [f"anti_hacking: {declared} declared torch op(s)"] if declared else []
    return score, notes


# ------------------------------------------------------------------------------------------
# CUDA engineering

_VECTOR = re.compile(
    r"\b(float4|float2|int4|int2|double2|__half2|__ldg|__ldcs|__stcs|cp\.async|"
    r"ld\.global\.nc|memcpy_async)\b"
)
_SHARED = re.compile(r"__shared__")
_SHUFFLE = re.compile(r"\b(__shfl\w*_sync|__reduce_\w+_sync|cg::reduce|warp\.shfl\w*)\b")
_LIBRARY = re.compile(r"\b(cublas\w*|cublasLt\w*|cudnn\w*|cutlass::\w+)", re.I)
_RESTRICT = re.compile(r"__restrict__")
_BOUNDS = re.compile(r"\bif\s*\([^)]*<\s*\w+|\bi\s*<\s*\w+\s*;\s*\w+\s*\+=\s*[^)]*gridDim")
_GRID_STRIDE = re.compile(
    r"\+=\s*[^;)]*(blockDim\.\w\s*\*\s*gridDim\.\w|gridDim\.\w\s*\*\s*blockDim\.\w)"
)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\(\s*(\d+)")


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def launch_configs(host_source: str) -> list[tuple[int, ...]]:
    """Literal block shapes of the kernel launches in ``host_source``.

    A launch is ``KERNELS.<name>(grid, block, ...)``; ``block`` is kept when it is an integer
    literal, a tuple of them, or a name assigned one literal in the same module.

    Args:
        host_source: Python host code of a candidate.

    Returns:
        One tuple per resolvable launch, in source order.
    """
    try:
        tree = ast.parse(host_source)
    except SyntaxError:
        return []
    literals: dict[str, tuple[int, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            value = _literal_block(node.value, {})
            if value and isinstance(target, ast.Name):
                literals[target.id] = value
            elif value and isinstance(target, ast.Attribute):
                literals[f"self.{target.attr}"] = value
    configs: list[tuple[int, ...]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2):
            continue
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "KERNELS"
        ):
            continue
        block = _literal_block(node.args[1], literals)
        if block:
            configs.append(block)
    return configs


def _literal_block(node: ast.AST, names: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return (node.value,)
    if isinstance(node, ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, int) for e in node.elts
    ):
        return tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return names.get(f"self.{node.attr}")
    return None


def _block_sane(block: Sequence[int]) -> bool:
    threads = 1
    for d in block:
        threads *= d
    return 0 < threads <= 1024 and threads % 32 == 0


def score_cuda_engineering(
    candidate: Candidate, compile_result: CompileResult | None = None
) -> tuple[float, list[str]]:
    """Score kernel craft from static signals of the source and the compile report.

    Half the score is hygiene, averaged over the checks that apply: bounds checks or grid-stride
    loops, ``__restrict__`` pointers, sane launch bounds and block sizes (a multiple of 32, at most
    1024 threads), and no register spills when a compile result is given. The other half is
    performance technique: vectorised or read-only loads (``float4``, ``__ldg``, ``cp.async``),
    shared memory, warp shuffles, and cuBLAS/cuBLASLt/cuDNN calls; any two earn it in full, since
    no single kernel needs all of them. A failed compile scores 0.

    Args:
        candidate: The program.
        compile_result: Its build report, when it was built.

    Returns:
        The score and notes naming the signals found.
    """
    if compile_result is not None and not compile_result.ok:
        return 0.0, ["cuda_engineering: did not compile"]
    source = _strip_comments(candidate.kernel_source + "\n" + (candidate.host_cpp or ""))
    notes: list[str] = []

    hygiene: list[bool] = []
    bounded = bool(_BOUNDS.search(source) or _GRID_STRIDE.search(source))
    hygiene.append(bounded)
    hygiene.append(bool(_RESTRICT.search(source)))
    bounds = [int(v) for v in _LAUNCH_BOUNDS.findall(source)]
    blocks = launch_configs(candidate.host_source)
    if bounds or blocks:
        hygiene.append(all(_block_sane((b,)) for b in bounds) and all(map(_block_sane, blocks)))
    if compile_result is not None and compile_result.resources:
        spills = sum(r.spill_loads_bytes + r.spill_stores_bytes for r in compile_result.resources)
        hygiene.append(spills == 0)
        if spills:
            notes.append(f"cuda_engineering: {spills} bytes of register spills")

    technique = {
        "vectorised loads": bool(_VECTOR.search(source)),
        "shared memory": bool(_SHARED.search(source)),
        "warp shuffles": bool(_SHUFFLE.search(source)),
        "vendor library": bool(
            _LIBRARY.search(source)
            or any(lib.lower().startswith(("cublas", "cudnn")) for lib in candidate.link_libraries)
        ),
    }
    used = [name for name, present in technique.items() if present]
    if used:
        notes.append(f"cuda_engineering: uses {', '.join(used)}")
    if not bounded:
        notes.append("cuda_engineering: no bounds check or grid-stride loop found")
    hygiene_score = sum(hygiene) / len(hygiene) if hygiene else 0.0
    technique_score = min(len(used), 2) / 2
    return 0.5 * hygiene_score + 0.5 * technique_score, notes


# ------------------------------------------------------------------------------------------
# Coverage


def score_coverage(
    covered_ops: Iterable[str],
    reference_ops: Iterable[str],
    declared_ops: Iterable[str] = (),
) -> tuple[float, list[str]]:
    """Fraction of the reference's ops that the candidate's kernels compute.

    Op names are compared by :func:`stitch_graph.checks.op_key`, so ``"conv2d"`` and
    ``"aten.convolution"`` match. An op that is declared as left to PyTorch does not count as
    covered even if it is also listed in ``covered_ops``.

    Args:
        covered_ops: Ops the kernels implement (from the plan items done).
        reference_ops: Ops of the reference program.
        declared_ops: Ops left to PyTorch.

    Returns:
        The score (1.0 when the reference lists no ops) and notes.
    """
    reference = op_keys(reference_ops)
    if not reference:
        return 1.0, []
    covered = (op_keys(covered_ops) - op_keys(declared_ops)) & reference
    missing = sorted(reference - covered)
    notes = [f"coverage: left to PyTorch or missing: {', '.join(missing)}"] if missing else []
    return len(covered) / len(reference), notes


# ------------------------------------------------------------------------------------------
# Skill compliance

# Each rule: keywords in the feedback item -> a check on (previous, new) candidates.
_FEEDBACK_RULES: list[tuple[tuple[str, ...], str]] = [
    (("hack", "torch compute", "cheat", *HACK_RULES), "hack"),
    (("vectori", "float4", "wider load", "__ldg"), "vector"),
    (("shared memory", "smem", "tiling", "tile "), "shared"),
    (("shuffle", "warp reduc", "warp-level"), "shuffle"),
    (("block size", "launch config", "threads per block", "occupancy", "grid size"), "launch"),
    (("fuse", "fusion", "fewer launches", "merge kernels"), "fusion"),
    (("restrict", "alias"), "restrict"),
    (("bounds", "out of range", "illegal memory", "out-of-bounds"), "bounds"),
    (("spill", "register pressure", "registers"), "spill"),
    (("cublas", "cudnn", "vendor library"), "library"),
    (("compile", "syntax", "nvcc", "nvrtc", "build"), "compile"),
]


def _count(pattern: re.Pattern[str], candidate: Candidate | None) -> int:
    if candidate is None:
        return 0
    return len(pattern.findall(_strip_comments(candidate.kernel_source)))


def _kernel_launch_count(candidate: Candidate | None) -> int:
    if candidate is None:
        return 0
    return len(re.findall(r"\bKERNELS\.\w+\s*\(", candidate.host_source)) + len(
        re.findall(r"<<<", candidate.host_cpp or "")
    )


def _changed(previous: Candidate | None, new: Candidate) -> bool:
    return previous is None or previous.digest != new.digest


def _addressed(
    check: str,
    previous: Candidate | None,
    new: Candidate,
    hack_report: HackReport,
    compile_result: CompileResult | None,
) -> bool:
    source = _strip_comments(new.kernel_source)
    if check == "vector":
        return _count(_VECTOR, new) > _count(_VECTOR, previous)
    if check == "shared":
        return _count(_SHARED, new) > _count(_SHARED, previous) or (
            previous is None and bool(_SHARED.search(source))
        )
    if check == "shuffle":
        return _count(_SHUFFLE, new) > _count(_SHUFFLE, previous)
    if check == "launch":
        before = launch_configs(previous.host_source) if previous else []
        bounds_before = _LAUNCH_BOUNDS.findall(previous.kernel_source) if previous else []
        return (launch_configs(new.host_source), _LAUNCH_BOUNDS.findall(source)) != (
            before,
            bounds_before,
        )
    if check == "fusion":
        kernels = len(re.findall(r"__global__", source))
        before = len(re.findall(r"__global__", previous.kernel_source)) if previous else 0
        return _kernel_launch_count(new) < _kernel_launch_count(previous) or kernels < before
    if check == "restrict":
        return _count(_RESTRICT, new) > _count(_RESTRICT, previous)
    if check == "bounds":
        return bool(_BOUNDS.search(source) or _GRID_STRIDE.search(source)) and _changed(
            previous, new
        )
    if check == "spill":
        if compile_result is not None and compile_result.resources:
            return all(
                r.spill_loads_bytes + r.spill_stores_bytes == 0 for r in compile_result.resources
            )
        return _changed(previous, new)
    if check == "library":
        return bool(_LIBRARY.search(source)) or any(
            lib.lower().startswith(("cublas", "cudnn")) for lib in new.link_libraries
        )
    if check == "hack":
        return not hack_report.rejected and _changed(previous, new)
    if check == "compile":
        if compile_result is not None:
            return compile_result.ok
        return _changed(previous, new)
    return _changed(previous, new)


def score_skill_compliance(
    candidate: Candidate,
    *,
    feedback_items: Sequence[FeedbackItem] | None,
    previous: Candidate | None = None,
    hack_report: HackReport | None = None,
    compile_result: CompileResult | None = None,
) -> tuple[float, list[str]]:
    """Fraction of feedback items the new candidate visibly addresses.

    Each item is matched by keywords in its action and detail (first match wins):

    - hack (or a hack rule name, or source ``hack-check``): the hack checks pass now and the
      code changed;
    - vectorise / float4 / wider loads: more vector or read-only loads than before;
    - shared memory / tiling: more ``__shared__`` declarations;
    - shuffle / warp reduction: more warp shuffles;
    - block size / launch config / occupancy: a different literal block shape or launch bound;
    - fuse / fusion: fewer kernel launches or fewer kernels;
    - restrict / aliasing: more ``__restrict__`` qualifiers;
    - bounds / illegal memory: a bounds check or grid-stride loop present, and the code changed;
    - spills / registers: no spills in the compile result (else: the code changed);
    - cuBLAS / cuDNN: a vendor library is called or linked;
    - compile / syntax / build errors: the compile succeeded (else: the code changed);
    - anything else: the code changed.

    Args:
        candidate: The new candidate.
        feedback_items: Feedback the candidate was asked to act on; None or empty for a
            write-from-task sample, which scores 1.0.
        previous: The candidate the feedback was about.
        hack_report: Hack checks of the new candidate.
        compile_result: Build report of the new candidate.

    Returns:
        The score and notes listing items not addressed.
    """
    if not feedback_items:
        return 1.0, []
    report = hack_report or HackReport()
    done = 0
    missed: list[str] = []
    for item in feedback_items:
        text = f"{item.action} {item.detail} {item.source}".lower()
        check = next(
            (name for words, name in _FEEDBACK_RULES if any(w in text for w in words)), "changed"
        )
        if _addressed(check, previous, candidate, report, compile_result):
            done += 1
        else:
            missed.append(item.action)
    notes = [f"skill_compliance: not addressed: {'; '.join(missed)}"] if missed else []
    return done / len(feedback_items), notes


# ------------------------------------------------------------------------------------------
# All four


def score_rubric(
    candidate: Candidate,
    *,
    hack_report: HackReport,
    compile_result: CompileResult | None = None,
    covered_ops: Iterable[str],
    reference_ops: Iterable[str],
    feedback_items: Sequence[FeedbackItem] | None = None,
    previous: Candidate | None = None,
) -> RubricScores:
    """Score the four rubric criteria for one candidate.

    Args:
        candidate: The program being scored.
        hack_report: Its static hack report.
        compile_result: Its build report, when built.
        covered_ops: Reference ops its kernels implement.
        reference_ops: All ops of the reference.
        feedback_items: For an improve-from-feedback sample, the feedback it was given.
        previous: For an improve-from-feedback sample, the candidate the feedback was about.

    Returns:
        The :class:`RubricScores`.
    """
    anti, anti_notes = score_anti_hacking(hack_report)
    eng, eng_notes = score_cuda_engineering(candidate, compile_result)
    declared = [*candidate.declared_torch_ops, *hack_report.declared_uses]
    cov, cov_notes = score_coverage(covered_ops, reference_ops, declared)
    skill, skill_notes = score_skill_compliance(
        candidate,
        feedback_items=feedback_items,
        previous=previous,
        hack_report=hack_report,
        compile_result=compile_result,
    )
    return RubricScores(
        anti_hacking=anti,
        cuda_engineering=eng,
        coverage=cov,
        skill_compliance=skill,
        notes=[*anti_notes, *eng_notes, *cov_notes, *skill_notes],
    )
