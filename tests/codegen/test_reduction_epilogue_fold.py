"""Per-item terms computed in a reduction's epilogue, and cheap masks copied one value at a time.

A detector's box loss sums a smooth-L1 over each anchor's four deltas and, beside it, computes
an IoU from the boxes' corners, whose intermediate values (the intersection, the union) several
epilogue ops read. Those pointwise kernels are now computed in the reduction's epilogue, per
row. The positive-anchor mask, read by that epilogue and by the final count, is copied into
both readers: each value is weighed alone, so copying the corners, which would not pay, no
longer keeps the mask's copies out. The program is two kernels (five before), and matches
PyTorch in the CPU emulation; without either change it is more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import _capture_recompute, _fusion_passes, schedule
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, planned_kernels

_BOX_LOSS = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, pd, td, pb, tb, labels):
        pos = (labels > 0).to(pd.dtype)
        l1 = F.smooth_l1_loss(pd, td, beta=0.1, reduction="none").sum(-1)
        px1, py1, px2, py2 = pb.unbind(-1)
        tx1, ty1, tx2, ty2 = tb.unbind(-1)
        iw = (torch.minimum(px2, tx2) - torch.maximum(px1, tx1)).clamp(min=0)
        ih = (torch.minimum(py2, ty2) - torch.maximum(py1, ty1)).clamp(min=0)
        inter = iw * ih
        union = (px2 - px1) * (py2 - py1) + (tx2 - tx1) * (ty2 - ty1) - inter
        iou = inter / union.clamp(min=1e-7)
        loss = (l1 + 2.0 * (1.0 - iou)) * pos
        return loss.sum() / pos.sum().clamp(min=1.0)


def _boxes():
    xy = torch.rand(4, 2048, 2) * 64
    return torch.cat([xy, xy + torch.rand(4, 2048, 2) * 16 + 1], dim=-1)


def get_inputs():
    return [torch.randn(4, 2048, 4), torch.randn(4, 2048, 4), _boxes(), _boxes(),
            torch.randint(-1, 5, (4, 2048))]


def get_init_inputs():
    return []
"""


def test_the_box_loss_is_two_kernels_and_matches_pytorch(tmp_path: Path) -> None:
    task, program = generate_checked(_BOX_LOSS)
    assert planned_kernels(_BOX_LOSS) == 2
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("change", ["fold", "one_at_a_time"])
def test_each_change_saves_a_kernel(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if change == "fold":  # only a pointwise kernel's epilogue takes the shared producers
        monkeypatch.setattr(_fusion_passes, "_epilogue_takes", lambda ir, into, shape: (
            into.anchor is None))
        # nor does a pointwise kernel store them beside its own result
        monkeypatch.setattr(schedule, "joins_storing", lambda *args: False)
    else:  # no value weighed: the mask stays a kernel of its own
        monkeypatch.setattr(_capture_recompute, "_MOST_TRIALS", 0)
    assert planned_kernels(_BOX_LOSS) > 2
