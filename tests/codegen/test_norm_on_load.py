"""A norm whose readers can all compute it as they load (a mean, a pool, a pointwise kernel) is
split into its row statistics and a normalisation each reader computes on load: the normalised
tensor is never written. Every case matches PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import (
    _capture_estimate,
    _capture_lower,
    _capture_norm_on_load,
    capture_program,
)
from stitch_graph.codegen.ir import numel
from stitch_graph.codegen.schedule import schedule_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.{conv}
        self.gn = torch.nn.GroupNorm(4, 8)
        self.bn = torch.nn.BatchNorm2d(8)
        self.inorm = torch.nn.InstanceNorm2d(8, affine=True)
        self.ln = torch.nn.LayerNorm(12)
        self.head = torch.nn.Linear(12, 4)

    def forward(self, x):
        y = self.conv(x)
        {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""
_SMALL = {"conv": "Conv2d(3, 8, 3)", "shape": "2, 3, 14, 14"}

SPLIT = [
    "return self.gn(y).mean(dim=[1, 2, 3])",  # KernelBench L2 23's pattern
    # batch statistics (training mode in both programs), then a pool
    """z = F.batch_norm(y, None, None, self.bn.weight, self.bn.bias, training=True)
        return F.max_pool2d(torch.relu(z), 2)""",
    """z = F.batch_norm(y.reshape(32, 72), None, None, training=True)
        return torch.softmax(z * 2.0, dim=1)""",  # L2 84's: batch statistics of (N, C)
    "return torch.amax(self.inorm(y), dim=(2, 3))",
    "return F.avg_pool2d(self.ln(y), 3, 1, 1)",  # a layer norm over the last dim
    "return torch.logsumexp(F.rms_norm(y, (12,)), dim=1)",
    # PoolFormer's token mixer: a pool and a pointwise kernel read the norm
    """z = self.gn(y)
        return F.avg_pool2d(z, 3, 1, 1, count_include_pad=False) - z""",
]


def _full_writes(source: str) -> int:
    """Kernels other than the convolution that write a tensor of the convolution's size."""
    ir = capture_program(load_task(source))
    size = max(numel(n.shape) for n in ir.nodes if n.op.startswith("conv"))
    return sum(
        g.kind != "conv" and numel(ir.node(g.output).shape) >= size for g in schedule_program(ir)
    )


@pytest.mark.parametrize("body", SPLIT)
def test_a_norm_read_on_load_is_never_written(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # launches cost nothing here: the emulation's tensors are too small to repay one otherwise;
    # every norm the split knows, not only those it takes by default
    monkeypatch.setattr(_capture_estimate, "LAUNCH_US", 0.0)
    monkeypatch.setattr(_capture_norm_on_load, "_LARGE", 0)
    monkeypatch.setattr(_capture_norm_on_load, "_SPLIT", _capture_norm_on_load._NORMS)
    source = _PROBLEM.format(body=body, **_SMALL)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
    split = _full_writes(source)
    monkeypatch.setattr(_capture_lower, "normalize_on_load", lambda ir: None)
    assert split == _full_writes(source) - 1


@pytest.mark.parametrize(
    "norm", ["F.batch_norm(y, None, None, training=True)", "self.gn(y)", "self.inorm(y)"]
)
def test_at_kernelbench_shapes_the_norms_that_measured_faster_are_split(norm: str) -> None:
    """KernelBench L2 72's and 23's sizes: a batch or group norm of 256M elements read by a
    pool, which computes it on load; an instance norm's split measured slower and is not
    taken."""
    source = _PROBLEM.format(
        conv="Conv3d(3, 8, 3)",
        shape="64, 3, 66, 66, 66",
        body=f"return F.avg_pool3d({norm}, 2)",
    ).replace("InstanceNorm2d", "InstanceNorm3d")
    assert _full_writes(source) == (1 if "inorm" in norm else 0)


@pytest.mark.parametrize(
    "body",
    [
        "return self.head(self.ln(y))",  # a GEMM reads its operand from memory
        "return torch.relu(self.gn(y))",  # one pass already: statistics, then the write
        """z = self.gn(y)
        return z, z.mean()""",  # the norm is an output
    ],
)
def test_a_norm_a_kernel_needs_in_memory_stays_whole(body: str) -> None:
    ir = capture_program(load_task(_PROBLEM.format(body=body, **_SMALL)))
    assert any(n.op in ("layer_norm", "group_norm") for n in ir.nodes)
