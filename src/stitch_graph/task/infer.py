"""Find the shapes and dtypes a reference model returns without paying for a real forward pass.

Problems are sized for a GPU (16M-element tensors, 4096-wide GEMMs), so running them on a CPU
just to learn the output shapes would take seconds to minutes. Shape propagation is enough: the
forward runs first on ``meta`` tensors (no storage, no arithmetic), then under PyTorch's
``FakeTensorMode`` (which also copes with tensors the forward creates itself), and only for small
problems on real CPU tensors. If every route fails the outputs stay unknown; that is not an error,
because later stages can still run the reference on the GPU.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from stitch_graph.artifacts import TensorSpec
from stitch_graph.shapes import fast_meta_rnns

__all__ = [
    "REAL_RUN_MAX_ELEMENTS",
    "ForwardFailed",
    "NonTensorOutput",
    "OutputInference",
    "dtype_name",
    "infer_outputs",
    "tensor_spec",
]

_log = logging.getLogger(__name__)

REAL_RUN_MAX_ELEMENTS = 4 * 1024 * 1024
"""A real CPU forward is only tried when the tensor inputs hold fewer elements than this."""

Method = Literal["meta", "fake", "real", "none"]


class NonTensorOutput(TypeError):
    """The forward returned something other than a tensor or a tuple/list of tensors."""

    def __init__(self, position: int | None, type_name: str) -> None:
        self.position = position
        self.type_name = type_name
        where = "the forward's return value" if position is None else f"output {position}"
        article = "an" if type_name[:1].lower() in "aeiou" else "a"
        super().__init__(f"{where} is {article} {type_name}, not a torch.Tensor")


class ForwardFailed(RuntimeError):
    """The forward raised when run on real inputs; ``__cause__`` holds the original exception."""


@dataclass
class OutputInference:
    """What output inference found.

    Attributes:
        outputs: One spec per output tensor; empty if no route worked.
        method: The route that produced ``outputs`` ("none" if none did).
        failures: Per route tried and failed, a one-line reason.
    """

    outputs: list[TensorSpec] = field(default_factory=list)
    method: Method = "none"
    failures: dict[str, str] = field(default_factory=dict)


def dtype_name(dtype: torch.dtype) -> str:
    """Spell a dtype the way ``TensorSpec`` does: ``torch.float32`` becomes ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def tensor_spec(t: torch.Tensor) -> TensorSpec:
    """The ``TensorSpec`` of a tensor (works for real, meta and fake tensors)."""
    return TensorSpec(shape=[int(d) for d in t.shape], dtype=dtype_name(t.dtype))


def _output_specs(out: Any) -> list[TensorSpec]:
    """Specs of a forward's return value: one tensor or a tuple/list of tensors."""
    if isinstance(out, torch.Tensor):
        return [tensor_spec(out)]
    if isinstance(out, (tuple, list)):
        specs = []
        for i, item in enumerate(out):
            if not isinstance(item, torch.Tensor):
                raise NonTensorOutput(i, type(item).__name__)
            specs.append(tensor_spec(item))
        return specs
    raise NonTensorOutput(None, type(out).__name__)


def _quiet_forward(model: nn.Module, args: Sequence[Any]) -> Any:
    """Run ``model(*args)`` without autograd and without letting warnings escape."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            return model(*args)


def _run_meta(model: nn.Module, args: Sequence[Any]) -> list[TensorSpec]:
    meta_model = fast_meta_rnns(copy.deepcopy(model).to("meta"))
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    return _output_specs(_quiet_forward(meta_model, meta_args))


def _run_fake(model: nn.Module, args: Sequence[Any]) -> list[TensorSpec]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    # FakeTensorMode logs a traceback at ERROR level for every op it cannot run; a failure here
    # only means "try the next route", so keep that out of the user's log.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with mode:
            return _output_specs(_quiet_forward(model, fake_args))
    finally:
        fake_log.setLevel(level)


def _run_real(model: nn.Module, args: Sequence[Any]) -> list[TensorSpec]:
    try:
        out = _quiet_forward(model, args)
    except Exception as exc:
        raise ForwardFailed(f"{type(exc).__name__}: {exc}") from exc
    return _output_specs(out)


def infer_outputs(
    model: nn.Module,
    args: Sequence[Any],
    *,
    real_run_max_elements: int = REAL_RUN_MAX_ELEMENTS,
) -> OutputInference:
    """Infer the output specs of ``model(*args)``, as cheaply as possible.

    Tries a meta-tensor forward on a deep copy of the model, then a fake-tensor forward, then,
    only if the tensor inputs hold fewer than ``real_run_max_elements`` elements, a real forward
    on the CPU. The model and the given tensors are not modified by the first two routes.

    Args:
        model: The constructed reference model.
        args: Forward arguments (tensors and plain numbers), as ``get_inputs()`` returned them.
        real_run_max_elements: Size limit for the real-run fallback.

    Returns:
        The specs and the route that found them, or empty outputs if nothing worked.

    Raises:
        NonTensorOutput: The forward returned something other than tensors (seen on any route).
        ForwardFailed: The forward raised on real inputs (only when the real run was tried).
    """
    result = OutputInference()
    for method, run in (("meta", _run_meta), ("fake", _run_fake)):
        try:
            result.outputs = run(model, args)
        except NonTensorOutput:
            raise
        except Exception as exc:  # any failure just means this route cannot trace the model
            result.failures[method] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        result.method = method
        return result

    numel = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
    if numel >= real_run_max_elements:
        result.failures["real"] = f"skipped: inputs hold {numel} elements"
        _log.info("output shapes unknown: %s", result.failures)
        return result
    result.outputs = _run_real(model, args)
    result.method = "real"
    return result
