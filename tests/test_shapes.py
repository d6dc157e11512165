"""The shapes ``shapes.recurrent_outputs`` gives equal those of a real LSTM/GRU forward."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from stitch_graph.shapes import fast_meta_rnns, recurrent_outputs

LAYERS = [
    torch.nn.GRU(5, 7, num_layers=2),
    torch.nn.GRU(5, 7, batch_first=True, bidirectional=True),
    torch.nn.LSTM(5, 7, num_layers=3, bidirectional=True),
    torch.nn.LSTM(5, 7, batch_first=True, proj_size=3),
    torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True, proj_size=4, batch_first=True),
]


def _flat(out: object) -> list[torch.Tensor]:
    output, state = out  # type: ignore[misc]
    return [output, *(state if isinstance(state, tuple) else (state,))]


@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize("layer", LAYERS, ids=lambda m: repr(m).replace(" ", ""))
@pytest.mark.parametrize("shape", [(4, 6, 5), (6, 5)], ids=["batched", "unbatched"])
def test_shapes_equal_a_real_forward(layer: torch.nn.Module, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    real = [t.shape for t in _flat(layer(x))]
    predicted = [t.shape for t in recurrent_outputs(layer, x.to("meta"))]
    assert predicted == real


def test_fast_meta_forward_keeps_the_return_structure_and_is_fast() -> None:
    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(64, 128, num_layers=6, bidirectional=True, batch_first=True)
            self.gru = torch.nn.GRU(256, 32)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out, (h, c) = self.lstm(x)
            y, h2 = self.gru(out)
            return y[-1], h, c, h2

    model = fast_meta_rnns(copy.deepcopy(Stack()).to("meta"))
    start = time.perf_counter()
    shapes = [t.shape for t in model(torch.empty(8, 512, 64, device="meta"))]
    assert time.perf_counter() - start < 1.0
    # the GRU is sequence-first: its 8 "steps" are the LSTM's batch
    assert shapes == [(512, 32), (12, 8, 128), (12, 8, 128), (1, 512, 32)]
