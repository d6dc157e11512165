"""Complex tensors as float pairs: rotary embeddings in the LLaMA form (``view_as_complex``,
a product with a complex buffer or ``polar``'s result, ``view_as_real``) and the parts of a
complex value, fully generated and matching PyTorch in the CPU emulation; the product is one
pointwise kernel. A complex value from a call left to PyTorch (an FFT) still feeds the pairs,
and programs returning a dense view of their own result return it without a copy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        t = torch.arange(32).float()
        f = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
        self.register_buffer("freqs_cis", torch.polar(torch.ones(32, 16), torch.outer(t, f)))
        self.register_buffer("inv", f)

    def forward(self, x, y):
        {body}


def get_inputs():
    return [torch.randn(2, 16, 4, 32), torch.randn(2, 16, 4, 32)]


def get_init_inputs():
    return []
"""

ROTARY = [
    # LLaMA's apply_rotary_emb: the buffer sliced and viewed for broadcasting
    """xq = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        fc = self.freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, 16)
        return torch.view_as_real(xq * fc).flatten(3).type_as(x)""",
    # the frequencies built in forward with polar, queries and keys rotated and multiplied
    """freqs = torch.outer(torch.arange(16, device=x.device).float(), self.inv)
        cis = torch.polar(torch.ones_like(freqs), freqs).view(1, 16, 1, 16)
        q = torch.view_as_real(torch.view_as_complex(x.reshape(2, 16, 4, 16, 2)) * cis).flatten(3)
        k = torch.view_as_real(torch.view_as_complex(y.reshape(2, 16, 4, 16, 2)) * cis).flatten(3)
        return torch.softmax(q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / 8.0, -1)""",
]

PARTS = [
    """c = torch.view_as_complex(x.reshape(2, 16, 4, 16, 2))
        d = c * 2.0 + c.conj() * c
        return d.real * 3 + d.imag - d.abs()""",
    """c = torch.view_as_complex(x.reshape(2, 16, 4, 16, 2)).unsqueeze(1)
        e = torch.polar(y[..., :16].abs() + 0.1, y[..., 16:])
        return torch.view_as_real((c * e.unsqueeze(1)).squeeze(1) * y[..., :16]).sum(-1)""",
]


@pytest.mark.parametrize("body", ROTARY)
def test_a_rotary_embedding_is_one_pointwise_kernel_and_matches_pytorch(
    body: str, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert re.search(r"void k\d+_flip_mul", program.kernel_source)  # a product of pairs: a kernel
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("body", PARTS)
def test_the_parts_of_complex_values_are_generated_and_match_pytorch(
    body: str, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_complex_value_pytorch_computes_feeds_the_pairs(tmp_path: Path) -> None:
    body = "return torch.view_as_real(torch.fft.rfft(x, dim=-1) * 2.0).sum(-1)"
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert "fft_rfft" in program.declared_torch_ops
    assert "mul" not in program.declared_torch_ops  # the product runs on the pair
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(
    ("body", "copied"),
    [
        ("return (x * 2).flatten(2)", False),  # a dense view of the program's result
        ("return (x * 2).transpose(1, 2)", True),  # a strided view: copied dense
        ("return x.flatten(2)", True),  # a view of the input: a fresh buffer
    ],
)
def test_a_returned_view_is_copied_only_where_it_must_be(
    body: str, copied: bool, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert ("copy_out" in program.host_source) is copied
    check_on_cpu(task, program, tmp_path, cooperative=True)
