"""The key a graphed forward replays under: it must change whenever the module's parameters or
buffers move or are replaced (a graph holds them by address), and cost little when they do not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stitch_graph.runtime.kernels import KernelLibrary


def _token(library: SimpleNamespace, module: torch.nn.Module) -> int:
    return KernelLibrary._state_token(library, module)


@pytest.fixture
def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def test_the_token_holds_while_nothing_moves(model, monkeypatch) -> None:
    library = SimpleNamespace()
    first = _token(library, model)
    walks = []
    original = torch.nn.Module.parameters
    monkeypatch.setattr(
        torch.nn.Module, "parameters", lambda self, *a, **k: walks.append(1) or original(self)
    )
    with torch.no_grad():
        model[0].weight.add_(1.0)  # new values, same memory: the graph reads them
        model[1].running_mean.zero_()
    assert _token(library, model) == first
    assert not walks  # the module tree was not walked again


def test_a_replaced_or_moved_tensor_changes_it(model) -> None:
    library = SimpleNamespace()
    tokens = [_token(library, model)]
    model[0].weight = torch.nn.Parameter(torch.randn(3, 4))  # a new parameter, registered
    tokens.append(_token(library, model))
    model[0].bias.data = torch.zeros(3)  # new memory under the same parameter
    tokens.append(_token(library, model))
    model[1].running_var = torch.ones(3)  # a buffer set anew
    tokens.append(_token(library, model))
    model[1].register_buffer("extra", torch.zeros(2))
    tokens.append(_token(library, model))
    assert len(set(tokens)) == len(tokens), tokens


def test_modules_have_their_own_tokens(model) -> None:
    library = SimpleNamespace()
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    assert _token(library, model) != _token(library, other)
    assert _token(library, model) == _token(library, model)
