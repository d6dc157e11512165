"""Output shapes of recurrent layers, without running them.

``nn.LSTM`` and ``nn.GRU`` have no meta kernel: on meta tensors their forward decomposes into the
ops of every time step of every layer (7 s for a 6-layer GRU over 512 steps, 15 s for a
bidirectional LSTM of the same size). Their outputs' shapes follow from the layer's sizes alone,
so loading a task and capturing its program compute them here instead.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["fast_meta_rnns", "is_recurrent", "recurrent_outputs"]


def is_recurrent(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an LSTM or GRU layer whose shapes ``recurrent_outputs`` gives."""
    return isinstance(module, torch.nn.LSTM | torch.nn.GRU)


def recurrent_outputs(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Empty meta tensors shaped as the layer's flat outputs: ``(output, h_n)`` for a GRU,
    ``(output, h_n, c_n)`` for an LSTM, for a batched (3-d) or unbatched (2-d) input."""
    directions = 2 if module.bidirectional else 1
    hidden = module.hidden_size
    h_out = getattr(module, "proj_size", 0) or hidden
    batched = x.dim() == 3
    if batched:
        batch, steps = (x.shape[0], x.shape[1]) if module.batch_first else (x.shape[1], x.shape[0])
        output = (batch, steps) if module.batch_first else (steps, batch)
        state: tuple[int, ...] = (directions * module.num_layers, batch)
    else:
        output, state = (x.shape[0],), (directions * module.num_layers,)

    def empty(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=x.dtype, device="meta")

    outputs = [empty(*output, directions * h_out), empty(*state, h_out)]
    if isinstance(module, torch.nn.LSTM):
        outputs.append(empty(*state, hidden))
    return tuple(outputs)


def _nested(module: torch.nn.Module, flat: tuple[torch.Tensor, ...]) -> Any:
    """The layer's own return structure: ``(output, h_n)`` or ``(output, (h_n, c_n))``."""
    return (flat[0], (flat[1], flat[2])) if len(flat) == 3 else (flat[0], flat[1])


def fast_meta_rnns(model: torch.nn.Module) -> torch.nn.Module:
    """Give every LSTM/GRU layer of ``model`` (a meta copy) a forward that only computes
    shapes; layers given packed sequences keep their own forward. Returns ``model``."""
    for module in model.modules():
        if not is_recurrent(module):
            continue
        own = module.forward

        def forward(x: Any, hx: Any = None, _module: Any = module, _own: Any = own) -> Any:
            if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
                return _own(x, hx)
            return _nested(_module, recurrent_outputs(_module, x))

        module.forward = forward
    return model
