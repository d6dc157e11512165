"""Values computed from constants alone are baked at capture (``_capture_constants``) where
they would be a kernel of their own: a grid of cell centres from ``arange`` and ``meshgrid``
copied flat, a scan of a mask from ``ones`` and ``triu``. A module's buffer is never folded,
since ``load_state_dict`` may change it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_rewrite_saves_kernels

_GRID = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((1, 30), 8.0))

    def forward(self, reg):
        ys = (torch.arange(20, dtype=reg.dtype, device=reg.device) + 0.5) * 8
        xs = (torch.arange(30, dtype=reg.dtype, device=reg.device) + 0.5) * self.scale[0]
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        return {result}


def get_inputs():
    return [torch.randn(4, 2, 20, 30)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    "result",
    [
        # the centres flattened (a copy of the expanded grid), as a box decode reads them
        "torch.stack([gx.reshape(1, -1) - reg[:, 0].flatten(1).exp(), "
        "gy.reshape(1, -1) + reg[:, 1].flatten(1)], dim=-1)",
        # a scan of a mask built from constants
        "reg + torch.triu(torch.ones(20, 30, device=reg.device), diagonal=1).cumsum(-1)",
    ],
)
def test_a_grid_of_constants_is_baked(
    result: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _GRID.format(result=result)
    check_rewrite_saves_kernels(source, tmp_path, monkeypatch, "fold_constants")


def test_a_buffer_and_what_it_reads_stay_computed() -> None:
    # gy's copy is baked; gx, read from the buffer, is copied on every call
    ir = capture_program(load_task(_GRID.format(result="gy.reshape(1, 1, 600) + gx.flatten()")))
    baked = [p.name for p in ir.params if p.value is not None]
    assert [name for name in baked if not name.startswith("_const_arange")], baked
    # xs reads the module's buffer: it is computed on every call, from the buffer's values
    assert any(r.name == "scale" for n in ir.nodes for r in n.tensor_refs())
