"""Output comparison rules on CPU tensors."""

from __future__ import annotations

import torch

from stitch_graph.artifacts import OutputCheck
from stitch_graph.execution import (
    aliases_any,
    compare_output,
    flatten_outputs,
    merge_checks,
    summarize_checks,
)

TOL = {"atol": 1e-4, "rtol": 1e-4}


def test_identical_outputs_pass():
    ref = torch.randn(4, 5)
    check = compare_output(0, ref.clone(), ref, **TOL)
    assert check.mismatch_fraction == 0 and check.max_abs_error == 0
    assert summarize_checks([check], **TOL) == ""


def test_mismatch_fraction_counts_elements_beyond_tolerance():
    ref = torch.ones(10)
    out = ref.clone()
    out[:3] += 1e-3  # beyond 1e-4 + 1e-4 * 1
    out[3] += 1e-4  # within 2e-4
    check = compare_output(0, out, ref, **TOL)
    assert abs(check.mismatch_fraction - 0.3) < 1e-9
    assert abs(check.max_abs_error - 1e-3) < 1e-6
    assert "30.00% of elements differ" in summarize_checks([check], **TOL)


def test_nan_where_reference_is_finite_fails():
    ref = torch.zeros(4)
    out = ref.clone()
    out[1] = float("nan")
    check = compare_output(0, out, ref, **TOL)
    assert not check.nonfinite_ok
    assert "NaN or Inf" in summarize_checks([check], **TOL)


def test_matching_nonfinite_values_pass_but_mixed_do_not():
    ref = torch.tensor([float("nan"), float("inf"), 1.0])
    assert compare_output(0, ref.clone(), ref, **TOL).mismatch_fraction == 0
    wrong = torch.tensor([1.0, float("-inf"), 1.0])
    assert compare_output(0, wrong, ref, **TOL).mismatch_fraction > 0


def test_shape_dtype_and_non_tensor():
    ref = torch.zeros(2, 3)
    assert not compare_output(0, torch.zeros(3, 2), ref, **TOL).shape_ok
    assert not compare_output(0, torch.zeros(2, 3, dtype=torch.float64), ref, **TOL).dtype_ok
    assert not compare_output(0, 3.0, ref, **TOL).shape_ok
    reason = summarize_checks([compare_output(0, ref.half(), ref, **TOL)], **TOL)
    assert "wrong dtype" in reason


def test_aliasing_detects_views_and_shared_storage():
    x = torch.randn(8, 8)
    assert aliases_any(x, [x])
    assert aliases_any(x[2:], [x])
    assert aliases_any(x.view(64), [x])
    assert not aliases_any(x.clone(), [x])
    assert not aliases_any(x, [3, None])


def test_merge_takes_the_worst_and_flags_are_reported():
    a = OutputCheck(index=0, max_abs_error=1.0)
    b = OutputCheck(index=0, mismatch_fraction=0.5, unwritten=True)
    merged = merge_checks([a, b])
    assert merged.max_abs_error == 1.0 and merged.mismatch_fraction == 0.5 and merged.unwritten
    assert "never written" in summarize_checks([merged], **TOL)
    aliased = OutputCheck(index=1, aliases_input=True)
    assert "aliases an input" in summarize_checks([aliased], **TOL)
    late = merge_checks([OutputCheck(index=2), OutputCheck(index=2, unjoined=True)])
    assert late.unjoined and "did not join" in summarize_checks([late], **TOL)


def test_a_copy_taken_before_the_work_finished_differs():
    from stitch_graph.execution.candidate import _differs

    final = torch.randn(6, 7)
    early = final.clone()
    early[3:] = float("nan")  # poisoned memory the side stream had not written yet
    assert _differs(early, final)
    assert not _differs(final.clone(), final)
    both_nan = torch.full((3,), float("nan"))
    assert not _differs(both_nan, both_nan.clone())  # nothing wrote it, before or after
    assert _differs(torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))
    assert not _differs(None, final) and not _differs(final[:2], final)


def test_flatten_outputs():
    t = torch.zeros(1)
    assert flatten_outputs(t) == [t]
    assert len(flatten_outputs((t, [t, t]))) == 3
