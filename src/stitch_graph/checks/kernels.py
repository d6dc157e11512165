"""Checks of the candidate's CUDA text: precision and whether the kernels do any work.

The host checks cannot see inside a kernel. A kernel can compute in half precision or TF32 on
fp32 data, or be a stub that copies an input or stores a constant while the host arranges for
the output to pass. These checks read the CUDA source (comments stripped) for those patterns,
restricted, for NVRTC candidates, to the kernels the host actually launches.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from stitch_graph.checks.names import _const_str

if TYPE_CHECKING:
    from stitch_graph.checks.context import CandidateContext, Findings


_KERNEL_HEAD = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(([^)]*)\)\s*\{',
    re.S,
)
_HALF_KERNEL = re.compile(
    r"\b(__\w*half\w*|__\w*bfloat16\w*|half2|nv_bfloat16|__float_to_tf32|"
    r"wmma::precision::tf32|(?:at|c10)::(?:Half|BFloat16)|k(?:Half|BFloat16|Float16)|"
    r"CUBLAS_TF32_TENSOR_OP_MATH|CUBLAS_COMPUTE_32F_FAST_\w+|CUBLAS_TENSOR_OP_MATH)\b"
    r"|cvt\.rna\.tf32|\.f16\b|\.bf16\b|\.tf32\b"
)
# Kernels of CUDA text an external program compiles itself: extern "C" is optional there, and
# templates are common.
_ANY_KERNEL_HEAD = re.compile(
    r'(?:extern\s+"C"\s+)?(?:template\s*<[^>]*>\s*)?__global__\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    r"(\w+)\s*\(([^)]*)\)\s*\{",
    re.S,
)
_LOAD = re.compile(r"^(?:__ldg\s*\(\s*&?\s*)?\w+\s*\[[^\]]*\]\s*\)?$")


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def _kernel_bodies(source: str, head: re.Pattern[str] = _KERNEL_HEAD) -> dict[str, tuple[str, str]]:
    """Map each extern "C" kernel (each kernel, with ``_ANY_KERNEL_HEAD``) to ``(parameters,
    body)``, matching braces."""
    bodies: dict[str, tuple[str, str]] = {}
    for match in head.finditer(source):
        depth, i = 1, match.end()
        while i < len(source) and depth:
            if source[i] == "{":
                depth += 1
            elif source[i] == "}":
                depth -= 1
            i += 1
        bodies[match.group(1)] = (match.group(2), source[match.end() : i - 1])
    return bodies


def _kernel_kind(params: str, body: str) -> str:
    """``"empty"``, ``"copy"`` (only loads or constants stored) or ``"work"``."""
    text = re.sub(r"\breinterpret_cast\s*<[^>]*>\s*\(\s*(\w+)\s*\)", r"\1", body)
    text = re.sub(r"\(\s*(?:const\s+)?\w+\s*\*\s*\)\s*", "", text)
    compact = re.sub(r"\s+", "", text)
    if compact in {"", "return;", ";"}:
        return "empty"
    pointers = {
        m.group(1) for m in re.finditer(r"\*\s*(?:__restrict__\s*)?(\w+)\s*(?:,|$)", params + ",")
    }
    if re.search(r"\b(atomic\w+|__shfl\w*|asm|wmma|mma|cublas\w*|cudnn\w*)\b", text):
        return "work"
    statements = [s.strip() for s in re.split(r"[;{}]", text) if s.strip()]
    # shared arrays and pointers into them: a value computed into one is staged for the store
    staged = set(re.findall(r"__shared__[^;]*?(\w+)\s*\[", text))
    staged |= {
        m.group(1) for m in re.finditer(r"\*\s*(?:const\s+)?(\w+)\s*=\s*(\w+)", text)
        if m.group(2) in staged
    }
    loads: set[str] = set()
    stores = 0

    def copied(rhs: str) -> bool:
        """Whether a stored value is a loaded one or a constant, not computed."""
        return rhs in loads or bool(_LOAD.match(rhs)) or bool(re.fullmatch(r"[-+]?[\d.]+[fF]?", rhs))

    for stmt in statements:
        decl = re.match(r"^(?:const\s+)?[\w:<>]+\s+(\w+)\s*=\s*(.+)$", stmt, re.S)
        assign = re.match(r"^(\w+)\s*(\[[^\]]*\])?\s*=\s*(.+)$", stmt, re.S)
        if decl:
            name, rhs = decl.group(1), decl.group(2).strip()
            if _LOAD.match(rhs) and rhs.split("[")[0].replace("__ldg", "").strip("( &") in pointers:
                loads.add(name)
            continue
        if assign and assign.group(2) and assign.group(1) in pointers:
            rhs = assign.group(3).strip()
            stores += 1
            if copied(rhs):
                continue
            return "work"
        if assign and assign.group(2) and assign.group(1) in staged:
            if not copied(assign.group(3).strip()):
                return "work"
        changed = re.match(r"^(\w+)(?:\.\w+)*\s*(?:[+\-*/%&|^]|<<|>>)?=(?!=)\s*(.+)$", stmt, re.S)
        if changed and changed.group(1) in loads and not _LOAD.match(changed.group(2).strip()):
            # a loaded value updated in place (v.x = fmaxf(v.x + b.x, 0.f); v += w) is no
            # longer a plain copy of its input
            loads.discard(changed.group(1))
            continue
        if re.search(r"[+\-*/%]=|\+\+|--", stmt) and not re.match(
            r"^(?:for|if|while|int|unsigned|size_t|long)\b", stmt
        ):
            # updates of locals such as accumulators count only if stored later
            continue
    return "copy" if stores else "work"


def _launched_kernels(tree: ast.Module | None) -> set[str] | None:
    if tree is None:
        return None
    launched: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "KERNELS":
                launched.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "getattr" and len(node.args) >= 2:
                if isinstance(node.args[0], ast.Name) and node.args[0].id == "KERNELS":
                    name = _const_str(node.args[1])
                    if name:
                        launched.add(name)
    return launched


def _check_kernel_precision(ctx: CandidateContext, out: Findings) -> None:
    """Half, bfloat16 or TF32 types and instructions in the CUDA text, for an fp32 reference."""
    if not ctx.fp32_reference:
        return
    source = _strip_comments(ctx.candidate.kernel_source)
    match = _HALF_KERNEL.search(source)
    if match:
        line = source.count("\n", 0, match.start()) + 1
        out.add_at_line(
            "precision_downgrade",
            f"kernel uses {match.group(0)} while the reference is fp32",
            line,
        )
    for node, text in _external_code(ctx):
        match = _HALF_KERNEL.search(_strip_comments(text))
        if match:
            out.add(
                "precision_downgrade",
                f"CUDA text in the host file uses {match.group(0)} while the reference is fp32",
                node,
            )


def _external_code(ctx: CandidateContext) -> list[tuple[ast.AST, str]]:
    """CUDA/C++ text the host file carries itself (an external program's kernels)."""
    host = ctx.host
    return [] if host is None else host.external.code


def _check_trivial_kernels(ctx: CandidateContext, out: Findings) -> None:
    """Launched kernels with an empty body, or that only copy data or store constants."""
    candidate = ctx.candidate
    source = _strip_comments(candidate.kernel_source)
    bodies = _kernel_bodies(source)
    launched: set[str] | None = None
    if bodies and candidate.form == "nvrtc":
        launched = _launched_kernels(ctx.tree)
    if not bodies:
        text = "\n".join(_strip_comments(t) for _, t in _external_code(ctx))
        bodies = _kernel_bodies(text, _ANY_KERNEL_HEAD)
    if not bodies:
        return
    relevant = {
        name: pb for name, pb in bodies.items() if launched is None or name in launched
    } or bodies
    kinds = {name: _kernel_kind(*pb) for name, pb in relevant.items()}
    for name, kind in kinds.items():
        if kind == "empty":
            out.add("trivial_kernel", f"kernel {name} has an empty body")
    if kinds and all(k in {"copy", "empty"} for k in kinds.values()):
        if any(k == "copy" for k in kinds.values()):
            names = ", ".join(sorted(kinds))
            out.add("trivial_kernel", f"kernels {names} only copy data or store constants")
