"""Helpers that reference and candidate workers share: loading the problem, seeding, inputs.

Both sides must build the model and draw inputs in exactly the same way, or parameters and inputs
would differ for reasons that have nothing to do with the candidate. Everything here runs inside
worker processes only.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from stitch_graph.runtime.problem_source import exec_problem

__all__ = [
    "build_on",
    "clone_to",
    "describe_exception",
    "device_name",
    "draw_inputs",
    "init_inputs",
    "load_module_state",
    "load_problem",
    "module_state",
    "refill",
    "save",
    "seed_forward",
    "set_tf32",
    "timing_draws",
]


def load_problem(source: str, name: str = "stitch_problem") -> dict[str, Any]:
    """Exec the problem source in a fresh module; return its namespace."""
    return exec_problem(source, f"<{name}>", name)


def set_tf32(allow: bool) -> None:
    """Allow or forbid TF32 in matmul and cuDNN (forbidden: true FP32)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def init_inputs(problem: dict[str, Any], seed: int) -> list[Any]:
    """``get_init_inputs()`` under ``seed`` (``[]`` when the problem has none)."""
    import torch

    torch.manual_seed(seed)
    get_init = problem.get("get_init_inputs")
    return list(get_init()) if get_init is not None else []


def seed_forward(seed: int, trial: int) -> None:
    """Seed the RNG before trial ``trial``'s forward, in the reference's worker and the
    candidate's alike: a model that draws in ``forward`` (``torch.randn`` initial states,
    training dropout) then gets the same draws on both sides, whatever each worker drew before
    (the candidate also runs warm-up and poisoned calls)."""
    import torch

    torch.manual_seed(seed + 7919 * (trial + 1))


def _is_constant(t: Any) -> bool:
    import torch

    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() < 2:
        return False
    flat = t.reshape(-1)
    return bool((flat == flat[0]).all().item())


def draw_inputs(problem: dict[str, Any], seed: int) -> list[Any]:
    """One fresh draw of ``get_inputs()`` under ``seed``; refuses constant floating inputs.

    Raises:
        ValueError: A floating input tensor is all zeros or constant (it would hide bugs).
    """
    import torch

    torch.manual_seed(seed)
    draw = list(problem["get_inputs"]())
    for i, value in enumerate(draw):
        if _is_constant(value):
            msg = (
                f"input {i} of get_inputs() is constant (all elements equal) under seed {seed}; "
                "a constant draw cannot tell right from wrong, use random inputs"
            )
            raise ValueError(msg)
    return draw


def build_on(model_class: Any, init: list[Any], device: str) -> Any:
    """``model_class(*init)`` built on ``device`` directly, where its constructor allows it.

    Drawing weights on the GPU takes milliseconds where the CPU takes about a second a gigabyte
    (a wide MLP has 8.6 GB). For runs that only compare two programs holding the same weights
    (tuning), not for the reference the Verifier judges against, whose weights follow the
    problem's seeded CPU construction. A constructor that cannot run there (NumPy on a fresh
    tensor, say) builds on the CPU and moves.
    """
    import torch

    try:
        with torch.device(device):
            return model_class(*init)
    except Exception:  # noqa: BLE001 - the CPU build below says what is wrong, if anything
        return model_class(*init).to(device)


def clone_to(values: list[Any], device: str) -> list[Any]:
    """Copies of ``values`` with tensors moved to ``device`` (other values as they are)."""
    import torch

    return [v.detach().to(device).clone() if isinstance(v, torch.Tensor) else v for v in values]


def timing_draws(
    draws: list[list[Any]], device: str, limit_bytes: int = 2 << 30
) -> list[list[Any]]:
    """The draws to refill inputs from between timed calls: on ``device`` when they fit.

    A refill from device memory is a device copy of microseconds; one from pageable host memory
    is a transfer of milliseconds that leaves the GPU idle (and its clocks falling) right before
    every timed call. Both sides of a comparison use this, so it changes no ratio by design.
    """
    import torch

    size = sum(
        v.numel() * v.element_size() for d in draws for v in d if isinstance(v, torch.Tensor)
    )
    if device == "cpu" or size > limit_bytes:
        return draws
    return [clone_to(d, device) for d in draws]


def refill(targets: list[Any], values: list[Any]) -> None:
    """Copy a draw into the existing input tensors, in place (same pointers, new contents)."""
    import torch

    with torch.no_grad():
        for dst, src in zip(targets, values, strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src, non_blocking=True)


def device_name(device: str) -> str:
    """Human-readable name of the device jobs run on."""
    if device == "cpu":
        import platform

        return f"cpu ({platform.processor() or platform.machine()})"
    import torch

    return torch.cuda.get_device_name()


def save(obj: Any, path: Path) -> None:
    """``torch.save`` via a temporary name, so a crash never leaves half a file."""
    import torch

    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """A JSON-safe description of ``exc`` with a one-line, classified ``reason``."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    lowered = text.lower()
    if "out of memory" in lowered or name == "OutOfMemoryError":
        kind = "CUDA out of memory"
    elif "illegal memory access" in lowered or "illegal_address" in lowered:
        kind = "illegal memory access (CUDA error 700)"
    elif "misaligned address" in lowered or "misaligned_address" in lowered:
        kind = "misaligned address (CUDA error 716)"
    elif "cuda error" in lowered or "cuda_error" in lowered or "cudaerror" in lowered:
        kind = "CUDA error"
    else:
        kind = "Python exception"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "kind": kind,
        "type": name,
        "message": text[:4000],
        "reason": f"{kind}: {name}: {first}"[:1000],
        "traceback": tb[-6000:],
    }


def module_state(model: Any) -> dict[str, Any]:
    """The model's parameters and buffers by name, non-persistent buffers included: a causal
    mask or a position table built in ``__init__`` is read by the program like a weight, and
    ``state_dict`` leaves it out."""
    state = dict(model.state_dict())
    for name, buffer in model.named_buffers():
        state.setdefault(name, buffer)
    return state


def load_module_state(model: Any, state: dict[str, Any]) -> list[str]:
    """Copy ``state``'s tensors into ``model``'s parameters and buffers (non-persistent ones
    too) where names and shapes match; the names copied."""
    import torch

    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    loaded: list[str] = []
    with torch.no_grad():
        for name, tensor in own.items():
            value = state.get(name)
            if torch.is_tensor(value) and tuple(value.shape) == tuple(tensor.shape):
                tensor.copy_(value)
                loaded.append(name)
    return loaded
