"""Output comparison: is a candidate's output the reference's, element by element?

Kept apart from the workers so it runs (and is tested) on CPU tensors. The rules are strict on
purpose, because loose ones are what reward hacks exploit: every element must satisfy
``|a - b| <= atol + rtol * |b|``; a NaN or Inf where the reference is finite fails; non-finite
values only match the same non-finite value; shapes and dtypes must be equal; an output that shares
memory with an input, or has elements the candidate never wrote, fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from stitch_graph.artifacts import OutputCheck

if TYPE_CHECKING:
    import torch

__all__ = [
    "aliases_any",
    "compare_output",
    "flatten_outputs",
    "merge_checks",
    "summarize_checks",
]


def flatten_outputs(value: Any) -> list[Any]:
    """The forward's result as a flat list (a tensor, or nested tuples/lists of them)."""
    if isinstance(value, (list, tuple)):
        flat: list[Any] = []
        for item in value:
            flat.extend(flatten_outputs(item))
        return flat
    return [value]


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """Byte range ``[start, end)`` of the storage behind ``t`` (``None`` if empty)."""
    storage = t.untyped_storage()
    start = storage.data_ptr()
    size = storage.nbytes()
    if size == 0 or start == 0:
        return None
    return start, start + size


def aliases_any(output: Any, inputs: Iterable[Any]) -> bool:
    """Whether ``output`` shares memory with any tensor in ``inputs``."""
    import torch

    if not isinstance(output, torch.Tensor):
        return False
    span = _span(output)
    if span is None:
        return False
    for item in inputs:
        if not isinstance(item, torch.Tensor) or item.device != output.device:
            continue
        other = _span(item)
        if other is not None and span[0] < other[1] and other[0] < span[1]:
            return True
    return False


def compare_output(
    index: int, output: Any, reference: Any, *, atol: float, rtol: float
) -> OutputCheck:
    """Compare one candidate output with the reference's.

    Args:
        index: Position of the output.
        output: The candidate's value (a tensor, or anything else, which fails).
        reference: The reference tensor.
        atol: Absolute tolerance.
        rtol: Relative tolerance.

    Returns:
        The check; it passes when ``summarize_checks`` finds nothing wrong with it.
    """
    import torch

    check = OutputCheck(index=index)
    if not isinstance(output, torch.Tensor):
        check.shape_ok = False
        check.dtype_ok = False
        check.mismatch_fraction = 1.0
        return check
    check.dtype_ok = output.dtype == reference.dtype
    if tuple(output.shape) != tuple(reference.shape):
        check.shape_ok = False
        check.mismatch_fraction = 1.0
        return check
    if reference.numel() == 0:
        return check
    a_all = output.detach().reshape(-1)
    b_all = reference.detach().reshape(-1)
    mismatches, nonfinite_bad, any_finite = 0, False, False
    max_abs, max_rel = 0.0, 0.0
    for start in range(0, b_all.numel(), _CHUNK):  # a slice at a time: outputs can be gigabytes
        a, b = (
            _as_float64(a_all[start : start + _CHUNK]),
            _as_float64(b_all[start : start + _CHUNK]),
        )
        finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
        # non-finite values match only the identical non-finite value (NaN with NaN, +Inf with +Inf)
        same_nonfinite = (~finite_a & ~finite_b) & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
        both = finite_a & finite_b
        diff = torch.where(both, (a - b).abs(), torch.zeros_like(a))
        close = both & (diff <= atol + rtol * b.abs())
        mismatches += int((~(close | same_nonfinite)).sum().item())
        nonfinite_bad |= bool((~finite_a & finite_b).any().item())
        if both.any():
            any_finite = True
            max_abs = max(max_abs, float(diff.max().item()))
            rel = diff / b.abs().clamp_min(max(atol, 1e-12))
            max_rel = max(
                max_rel, float(torch.where(both, rel, torch.zeros_like(rel)).max().item())
            )
    check.mismatch_fraction = mismatches / b_all.numel()
    check.nonfinite_ok = not nonfinite_bad
    if any_finite:
        check.max_abs_error = max_abs
        check.max_rel_error = max_rel
    return check


_CHUNK = 1 << 24


def _as_float64(t: Any) -> Any:
    """A slice on the CPU in float64 (complex values as pairs of reals)."""
    import torch

    t = t.to("cpu")
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128))
    return t.to(torch.float64)


def merge_checks(checks: Sequence[OutputCheck]) -> OutputCheck:
    """The worst of several trials' checks of the same output."""
    merged = OutputCheck(index=checks[0].index)
    for c in checks:
        merged.shape_ok &= c.shape_ok
        merged.dtype_ok &= c.dtype_ok
        merged.nonfinite_ok &= c.nonfinite_ok
        merged.aliases_input |= c.aliases_input
        merged.unwritten |= c.unwritten
        merged.unjoined |= c.unjoined
        merged.max_abs_error = max(merged.max_abs_error, c.max_abs_error)
        merged.max_rel_error = max(merged.max_rel_error, c.max_rel_error)
        merged.mismatch_fraction = max(merged.mismatch_fraction, c.mismatch_fraction)
    return merged


def summarize_checks(checks: Sequence[OutputCheck], *, atol: float, rtol: float) -> str:
    """Empty when every check passes, else one line saying what is wrong with the first failure."""
    for c in checks:
        where = f"output {c.index}"
        if not c.shape_ok:
            return f"{where}: wrong shape (or not a tensor)"
        if not c.dtype_ok:
            return f"{where}: wrong dtype"
        if c.aliases_input:
            return f"{where}: aliases an input (shares its memory)"
        if c.unwritten:
            return f"{where}: some elements were never written (poisoned memory came back)"
        if c.unjoined:
            return (
                f"{where}: not complete on the current stream when forward returned (work on "
                "another stream that forward did not join back)"
            )
        if not c.nonfinite_ok:
            return f"{where}: NaN or Inf where the reference is finite"
        if c.mismatch_fraction > 0:
            return (
                f"{where}: {c.mismatch_fraction:.2%} of elements differ beyond atol={atol:g}, "
                f"rtol={rtol:g} (max abs error {c.max_abs_error:.3g}, "
                f"max rel error {c.max_rel_error:.3g})"
            )
    return ""
