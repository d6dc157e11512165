"""Writes through integer-tensor indices: ``index_put_`` (with ``accumulate``, duplicate
indices adding up), ``torch.index_put``, ``index_copy``, ``index_fill`` and
``y[rows, cols] = v`` become one scatter into a copy
of the tensor, or into the tensor itself where nothing else reads it. Before, PyTorch ran them,
and its deterministic accumulate made a GCN's adjacency 6x slower than ``torch.compile``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, rows, cols, w):
        {body}


def get_inputs():
    rows = torch.randint(0, 16, (4, 40))
    rows[:, :8] = rows[:, 8:16]  # repeated pairs: accumulate adds both
    cols = torch.randint(-16, 16, (4, 40))
    cols[:, :8] = cols[:, 8:16]
    return [torch.randn(4, 16, 8), rows, cols, torch.randn(4, 40)]


def get_init_inputs():
    return []
"""

BODIES = {
    "accumulate_twice": """adj = x.new_zeros(4, 16, 16)
        b = torch.arange(4, device=x.device)[:, None].expand(4, 40)
        adj.index_put_((b, rows, cols), torch.sigmoid(w), accumulate=True)
        adj = torch.index_put(adj, (b, cols, rows), w * 2, accumulate=True)
        return adj @ x""",
    "store_rows": """y = x * 2
        y[rows[0, :5] % 4] = x[0]
        return y + 1""",
    "store_scalar_after_slice": """y = x.clone()
        y[:, rows[0], cols[0] % 8] = 0.5
        return y.sum(-1)""",
    "accumulate_rows_broadcast": """y = torch.tanh(x)
        y.index_put_((rows[0] % 4,), w[0, :8], accumulate=True)
        return y""",
    # index_copy and index_fill: the same writes along one dim
    "index_copy_and_fill": """y = x.clone()
        y.index_copy_(1, torch.tensor([3, 11, 7], device=x.device), x[:, :3] * 2)
        return torch.index_fill(y, 2, torch.tensor([6, 1], device=x.device), -1.0)""",
}


@pytest.mark.parametrize("name", BODIES)
def test_index_put_is_a_generated_scatter(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=BODIES[name]))
    assert not program.declared_torch_ops, program.declared_torch_ops
    host = program.host_source
    assert ".index_put_(" not in host and "torch.index_put(" not in host and "] = " not in host
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_chain_of_puts_writes_one_buffer(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=BODIES["accumulate_twice"]))
    assert program.host_source.count("written in place") == 2
    assert "_copy(" not in program.host_source


def test_a_put_into_a_tensor_read_later_writes_a_copy(tmp_path: Path) -> None:
    body = """adj = x.new_zeros(4, 16, 16)
        b = torch.arange(4, device=x.device)[:, None].expand(4, 40)
        adj2 = torch.index_put(adj.exp(), (b, rows, cols), w, accumulate=True)
        return adj2 @ x, adj.exp() * 3"""
    task, program = generate_checked(_PROBLEM.format(body=body))
    check_on_cpu(task, program, tmp_path, cooperative=True)
