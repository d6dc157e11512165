"""Turn a KernelBench-format problem file into a validated ``Task``.

Everything downstream (Planner, Coder, Verifier) trusts the ``Task``: its input specs drive code
generation and its output specs drive checking. So the loader runs the problem's own code once,
checks every convention of the format, and fails early with a ``TaskLoadError`` that names the
file, says what is wrong and how to fix it, instead of letting a malformed problem surface as a
confusing failure rounds later.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import traceback
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from stitch_graph.artifacts import Task, TensorSpec
from stitch_graph.runtime.problem_source import remember_source
from stitch_graph.task.infer import ForwardFailed, NonTensorOutput, infer_outputs, tensor_spec

__all__ = ["TaskLoadError", "load_task"]

_log = logging.getLogger(__name__)
_module_ids = itertools.count()

_PLAIN_INPUT = (bool, int, float)
_PLAIN_INIT = (bool, int, float, str)
_SEED = 0


class TaskLoadError(ValueError):
    """A problem file that cannot be turned into a ``Task``.

    Attributes:
        problem: What is wrong, starting with the file (and line, where known).
        path: The file (or ``<name>`` for source text) the error is about.
        fix: What to change so that the problem loads.
    """

    def __init__(self, problem: str, path: str = "", fix: str = "") -> None:
        self.problem = problem
        self.path = path
        self.fix = fix
        super().__init__(f"{problem} Fix: {fix}" if fix else problem)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problem, self.path, self.fix))


def _fail(msg: str, where: str, fix: str) -> NoReturn:
    raise TaskLoadError(msg, path=where, fix=fix)


def _looks_like_path(text: str) -> bool:
    """Whether a string argument names a file rather than holding problem source."""
    if "\n" in text:
        return False
    return text.endswith(".py") or os.sep in text or Path(text).exists()


def _read(
    source_or_path: str | os.PathLike[str], name: str | None
) -> tuple[str, str, str, str | None]:
    """Return ``(source, name, label, path)``; ``label`` names the problem in messages."""
    if isinstance(source_or_path, os.PathLike) or _looks_like_path(source_or_path):
        path = Path(source_or_path)
        label = str(path)
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            msg = f"{label}: the problem file {what}."
            _fail(msg, label, "check the path, or pass the problem's source text instead")
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"{label}: cannot read the problem file ({type(exc).__name__}: {exc})."
            _fail(msg, label, "make the file readable UTF-8 text")
        return source, name or path.stem, label, label
    task_name = name or "problem"
    return source_or_path, task_name, f"<{task_name}>", None


def _user_line(exc: BaseException, label: str) -> str:
    """``label:line`` of the deepest frame of ``exc`` inside the problem file, else ``label``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == label]
    return f"{label}:{frames[-1].lineno}" if frames else label


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a dict", "an int"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _execute(source: str, label: str) -> dict[str, Any]:
    """Compile and run the problem source in a fresh module; return its namespace."""
    try:
        code = compile(source, label, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{label}:{exc.lineno}" if exc.lineno else label
        msg = f"{where}: syntax error: {exc.msg}."
        _fail(msg, label, "correct the Python syntax at that line")

    remember_source(source, label)  # torch.jit.script reads its functions' lines
    module_name = f"_stitch_problem_{next(_module_ids)}"
    module = types.ModuleType(module_name)
    module.__file__ = label
    sys.modules[module_name] = module  # dataclasses, typing and pickling look modules up here
    try:
        exec(code, module.__dict__)
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        where = _user_line(exc, label)
        msg = f"{where}: importing the problem failed: no module named '{missing}'."
        _fail(msg, label, f"install '{missing}' into this environment, or remove the import")
    except ImportError as exc:
        msg = f"{_user_line(exc, label)}: importing the problem failed: {_describe(exc)}."
        _fail(msg, label, "fix the import (a name the imported module does not define?)")
    except (Exception, SystemExit) as exc:
        msg = f"{_user_line(exc, label)}: the module-level code raised {_describe(exc)}."
        _fail(msg, label, "make the file import cleanly: module-level code must not raise")
    finally:
        sys.modules.pop(module_name, None)
    return module.__dict__


def _get_callables(
    namespace: dict[str, Any], label: str
) -> tuple[type[nn.Module], Callable[[], Any], Callable[[], Any] | None]:
    """Check that ``Model``, ``get_inputs`` and (optionally) ``get_init_inputs`` are usable."""
    model_cls = namespace.get("Model")
    if model_cls is None:
        msg = f"{label}: the problem defines no `Model`."
        _fail(msg, label, "define `class Model(nn.Module)` with `__init__` and `forward`")
    if not (isinstance(model_cls, type) and issubclass(model_cls, nn.Module)):
        kind = model_cls.__name__ if isinstance(model_cls, type) else type(model_cls).__name__
        base = "a class" if isinstance(model_cls, type) else "an object"
        msg = f"{label}: `Model` is {base} ({kind}) that is not a subclass of torch.nn.Module."
        _fail(msg, label, "make Model subclass torch.nn.Module: `class Model(nn.Module):`")

    get_inputs = namespace.get("get_inputs")
    if get_inputs is None:
        msg = f"{label}: the problem defines no `get_inputs`."
        _fail(msg, label, "define `get_inputs()` returning the list of forward arguments")
    if not callable(get_inputs):
        msg = f"{label}: `get_inputs` is {_a(type(get_inputs).__name__)}, not a function."
        _fail(msg, label, "define `get_inputs()` returning the list of forward arguments")

    get_init_inputs = namespace.get("get_init_inputs")
    if get_init_inputs is not None and not callable(get_init_inputs):
        msg = f"{label}: `get_init_inputs` is {_a(type(get_init_inputs).__name__)}, not a function."
        _fail(msg, label, "define `get_init_inputs()` returning a list, or leave it out")
    return model_cls, get_inputs, get_init_inputs


def _json_safe(value: Any) -> Any:
    """A JSON-safe copy of a plain init value (tuples become lists); ``TypeError`` if not plain."""
    if value is None or isinstance(value, _PLAIN_INIT):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    raise TypeError(type(value).__name__)


def _init_args(
    get_init_inputs: Callable[[], Any] | None, label: str
) -> tuple[list[Any], list[Any]]:
    """Call ``get_init_inputs``; return the raw arguments and their JSON-safe record."""
    if get_init_inputs is None:
        return [], []
    try:
        raw = get_init_inputs()
    except Exception as exc:
        msg = f"{_user_line(exc, label)}: get_init_inputs() raised {_describe(exc)}."
        _fail(msg, label, "make get_init_inputs() run without errors")
    if not isinstance(raw, (list, tuple)):
        msg = f"{label}: get_init_inputs() returned {_a(type(raw).__name__)}, not a list."
        _fail(msg, label, "return a list of constructor arguments from get_init_inputs()")
    record = []
    for i, value in enumerate(raw):
        try:
            record.append(_json_safe(value))
        except TypeError as exc:
            msg = f"{label}: get_init_inputs() entry {i} is (or holds) {_a(str(exc))}."
            fix = (
                "init inputs must be plain values (int, float, bool, str, None, or lists/tuples "
                "of them); build tensors and modules inside Model.__init__ instead"
            )
            _fail(msg, label, fix)
    return list(raw), record


def _on_meta(
    model_cls: type[nn.Module], init: list[Any], get_inputs: Callable[[], Any], run_reference: bool
) -> tuple[nn.Module, list[Any], list[TensorSpec]] | None:
    """Model, arguments and output specs built on the meta device: shapes without storage.

    A whole level-3 model or a 6 GB input costs nothing there. Anything that needs real values
    (an ``.item()`` in ``__init__``, inputs made on another device, a forward that cannot trace)
    returns ``None``, and the caller builds for real, with its clear error messages.
    """
    try:
        with torch.device("meta"):
            torch.manual_seed(_SEED)
            model = model_cls(*init)
            torch.manual_seed(_SEED)
            args = get_inputs()
    except Exception:  # noqa: BLE001 - the real build reports the problem, if there is one
        return None
    if (
        not isinstance(args, (list, tuple))
        or not all(
            isinstance(a, _PLAIN_INPUT) or (isinstance(a, torch.Tensor) and a.is_meta) for a in args
        )
        or not any(isinstance(a, torch.Tensor) for a in args)
    ):
        return None
    if any(t.device.type != "meta" for t in [*model.parameters(), *model.buffers()]):
        return None
    args = list(args)
    if not run_reference:
        return model, args, []
    try:
        inferred = infer_outputs(model, args, real_run_max_elements=0)
    except Exception:  # noqa: BLE001 - a non-tensor output or a failing forward: build for real
        return None
    return (model, args, inferred.outputs) if inferred.outputs else None


def _construct(model_cls: type[nn.Module], init: list[Any], label: str) -> nn.Module:
    try:
        return model_cls(*init)
    except Exception as exc:
        msg = f"{_user_line(exc, label)}: Model(*get_init_inputs()) raised {_describe(exc)}."
        _fail(msg, label, "make Model(*get_init_inputs()) construct without errors")


def _forward_args(get_inputs: Callable[[], Any], label: str) -> list[Any]:
    """Call ``get_inputs`` and check every entry is a tensor or a plain number."""
    try:
        args = get_inputs()
    except Exception as exc:
        msg = f"{_user_line(exc, label)}: get_inputs() raised {_describe(exc)}."
        _fail(msg, label, "make get_inputs() run without errors")
    if not isinstance(args, (list, tuple)):
        msg = f"{label}: get_inputs() returned {_a(type(args).__name__)}, not a list."
        _fail(msg, label, "return a list of forward arguments from get_inputs()")
    for i, arg in enumerate(args):
        if not isinstance(arg, (torch.Tensor, *_PLAIN_INPUT)):
            kind = type(arg).__qualname__
            if type(arg).__module__ != "builtins":
                kind = f"{type(arg).__module__}.{kind}"
            msg = f"{label}: get_inputs() entry {i} is {_a(kind)}, not a tensor or a plain number."
            fix = (
                "forward arguments must be torch tensors or plain int/float/bool; convert it "
                "(e.g. torch.from_numpy(...)) or build it inside the Model"
            )
            _fail(msg, label, fix)
    if not any(isinstance(a, torch.Tensor) for a in args):
        what = "an empty list" if not args else "no tensors"
        msg = f"{label}: get_inputs() returned {what}; there is nothing for a kernel to read."
        _fail(msg, label, "return at least one torch.Tensor from get_inputs()")
    return list(args)


def _outputs(model: nn.Module, args: list[Any], label: str) -> list[TensorSpec]:
    try:
        return infer_outputs(model, args).outputs
    except NonTensorOutput as exc:
        msg = f"{label}: Model.forward returned a non-tensor: {exc}."
        _fail(msg, label, "return a tensor or a tuple/list of tensors from forward")
    except ForwardFailed as exc:
        cause = exc.__cause__ or exc
        where = _user_line(cause, label)
        msg = f"{where}: Model.forward raised {_describe(cause)} on get_inputs()'s arguments."
        _fail(msg, label, "make Model.forward run on the arguments get_inputs() returns")


def load_task(
    source_or_path: str | os.PathLike[str],
    *,
    name: str | None = None,
    run_reference: bool = True,
) -> Task:
    """Load a KernelBench-format problem and validate it.

    The problem's code runs in a fresh module namespace with the torch RNG seeded to 0 (the
    caller's RNG state is restored afterwards), so loading is deterministic.

    Args:
        source_or_path: A path to a ``.py`` problem file, or the problem's source text. A string
            is taken as a path when it has no newline and ends in ``.py``, contains a path
            separator, or names an existing file.
        name: Task name; defaults to the file stem, or ``"problem"`` for source text.
        run_reference: Whether to run the forward (on meta or fake tensors, or small real ones)
            to infer the output specs. The model is constructed and ``get_inputs()`` called
            either way.

    Returns:
        The validated ``Task``; ``outputs`` is empty if they could not be inferred cheaply.

    Raises:
        TaskLoadError: The file is missing or unreadable, does not compile or import, lacks
            ``Model``/``get_inputs``, has malformed inputs or init inputs, or its model cannot be
            constructed or run. The message names the file, the fault and the fix.
    """
    source, task_name, label, path = _read(source_or_path, name)
    with warnings.catch_warnings(record=True) as caught, torch.random.fork_rng(devices=[]):
        warnings.simplefilter("always")
        namespace = _execute(source, label)
        model_cls, get_inputs, get_init_inputs = _get_callables(namespace, label)
        torch.manual_seed(_SEED)
        init, init_record = _init_args(get_init_inputs, label)
        built = _on_meta(model_cls, init, get_inputs, run_reference)
        if built is None:  # the problem needs real values to build: build it for real
            torch.manual_seed(_SEED)
            model = _construct(model_cls, init, label)
            torch.manual_seed(_SEED)
            args = _forward_args(get_inputs, label)
            outputs = _outputs(model, args, label) if run_reference else []
        else:
            model, args, outputs = built
        varying = _varying_shapes(get_inputs, args, on_meta=built is not None)
    for w in caught:
        _log.debug("%s: warning while loading: %s", label, w.message)

    return Task(
        name=task_name,
        source=source,
        path=path,
        inputs=[tensor_spec(a) if isinstance(a, torch.Tensor) else None for a in args],
        input_values=[None if isinstance(a, torch.Tensor) else a for a in args],
        init_args=init_record,
        outputs=outputs,
        parameter_count=sum(p.numel() for p in model.parameters()),
        varying_inputs=varying,
    )


def _varying_shapes(get_inputs: Callable[[], Any], first: list[Any], *, on_meta: bool) -> list[int]:
    """Positions of tensor arguments whose shape a second draw of ``get_inputs`` (another seed)
    changes; drawn on the meta device where the first draw was, so it costs nothing there."""
    try:
        with torch.device("meta") if on_meta else contextlib.nullcontext():
            torch.manual_seed(_SEED + 1)
            again = list(get_inputs())
    except Exception:  # noqa: BLE001 - the first draw was checked; a second one is only a probe
        return []
    return [
        i for i, (a, b) in enumerate(zip(first, again, strict=False))
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape
    ]
