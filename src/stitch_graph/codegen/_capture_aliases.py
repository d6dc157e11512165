"""Alias tracking: keep the pure IR right when ``forward`` writes tensors in place.

A ``Ref`` names one value, but ``x.relu_()``, ``x += y`` or ``out=x`` change a storage that other
traced tensors (aliases, views, the base of a view) may share. This module finds the tensor an op
writes (``_mutated_arg``), rebinds every tensor that is exactly the written one to the op's
result, and refuses a later read of any other tensor on that storage (``_Writes``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_base import CaptureError, _flat, module_state
from stitch_graph.codegen.ir import ProgramIR, Ref

_INPLACE_DUNDERS: dict[Any, str] = {
    operator.iadd: "__iadd__",
    operator.isub: "__isub__",
    operator.imul: "__imul__",
    operator.itruediv: "__itruediv__",
    operator.ifloordiv: "__ifloordiv__",
    operator.imod: "__imod__",
    operator.ipow: "__ipow__",
    operator.iand: "__iand__",
    operator.ior: "__ior__",
    operator.ixor: "__ixor__",
}


def _mutated_arg(fx_node: torch.fx.Node) -> torch.fx.Node | None:
    """The traced tensor an op writes in place (``x.relu_()``, ``F.relu(x, inplace=True)``,
    ``x += y``, ``torch.add(a, b, out=x)``), else None."""
    out = fx_node.kwargs.get("out")
    if isinstance(out, torch.fx.Node):
        return out
    target = fx_node.target
    name = (
        target.overloadpacket.__name__
        if isinstance(target, torch._ops.OpOverload)
        else str(target) if fx_node.op == "call_method" else getattr(target, "__name__", "")
    )
    # operator.and_ and or_ (``a & b``) end in "_" but write nothing; ``a &= b`` is iand
    from_operator = getattr(target, "__module__", None) in ("operator", "_operator")
    inplace = (
        (name.endswith("_") and not name.endswith("__") and not from_operator)
        or fx_node.kwargs.get("inplace") is True
        or target in _INPLACE_DUNDERS
    )
    first = fx_node.args[0] if fx_node.args else None
    return first if inplace and isinstance(first, torch.fx.Node) else None


def _storages(value: Any) -> list[int]:
    """Identities of the storages behind a traced value (a tensor or a sequence of them)."""
    tensors = [value] if torch.is_tensor(value) else [v for v in _flat(value) if torch.is_tensor(v)]
    return [t.untyped_storage()._cdata for t in tensors]


def _same_tensor(a: Any, b: Any) -> bool:
    """Whether two traced meta tensors are one view of one storage: the same elements."""
    return (
        torch.is_tensor(a)
        and torch.is_tensor(b)
        and a.untyped_storage()._cdata == b.untyped_storage()._cdata
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


class _Writes:
    """Keeps the pure IR honest about in-place writes.

    A ``Ref`` names one value, but an in-place op changes a storage, and every traced tensor on
    that storage (the written tensor, its aliases, its views, its base) can see the change.
    Storages come from the meta tensors of shape propagation, so aliasing is PyTorch's own
    (``b.contiguous()`` of a contiguous ``b`` is ``b``; ``reshape`` of a transposed tensor is a
    copy). After a write, the tensors that are the written tensor itself (same storage, offset,
    shape and strides) are rebound to the op's result; any other tensor on the storage is out of
    date, and a later read of it is refused rather than lowered to a wrong program.
    """

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}  # storage -> in-place writes so far
        self.writer: dict[int, str] = {}  # storage -> the last op that wrote it
        self.seen: dict[str, dict[int, int]] = {}  # fx node -> versions its Ref holds
        self.nodes: list[torch.fx.Node] = []

    def record(self, fx_node: torch.fx.Node, *, initial: bool = False) -> None:
        """``fx_node``'s Ref holds its storages as they are now (as first given: ``initial``)."""
        value = fx_node.meta.get("sg_value")
        stores = _storages(value)
        if not stores:
            return
        self.seen[fx_node.name] = {s: 0 if initial else self.versions.get(s, 0) for s in stores}
        self.nodes.append(fx_node)

    def check_reads(
        self, fx_node: torch.fx.Node, *, allow: tuple[str, str] | None = None
    ) -> None:
        """Refuse ``fx_node`` if it reads a tensor an in-place op has changed under its Ref.

        ``allow`` is (tensor, writer): that tensor may be read once that op, and only it, has
        written its storage since (an assignment overwriting the region the op wrote)."""
        for arg in fx_node.all_input_nodes:
            for store, version in self.seen.get(arg.name, {}).items():
                tolerated = (
                    allow is not None
                    and arg.name == allow[0]
                    and self.writer.get(store) == allow[1]
                    and self.versions.get(store, 0) == version + 1
                )
                if self.versions.get(store, 0) != version and not tolerated:
                    msg = (
                        f"{fx_node.name}: reads {arg.name} after the in-place op "
                        f"{self.writer[store]} wrote into its storage through another alias or "
                        "view; such writes are not supported"
                    )
                    raise CaptureError(msg)

    def write(
        self,
        ir: ProgramIR,
        fx_node: torch.fx.Node,
        mutated: torch.fx.Node,
        before: Any,
        env: dict[str, Any],
        *,
        after: Any = None,
    ) -> None:
        """``fx_node`` wrote ``mutated`` in place; ``before`` was its Ref until then, and
        ``after`` (by default ``fx_node``'s own Ref) is its value now."""
        after = env.get(fx_node.name) if after is None else after
        if isinstance(before, Ref) and after == before:
            return  # an identity (dropout in eval): nothing changed
        written = mutated.meta.get("sg_value")
        for store in _storages(written):
            self.versions[store] = self.versions.get(store, 0) + 1
            self.writer[store] = fx_node.name
        if isinstance(before, Ref) and before.kind == "input":
            ir.notes.append(
                f"{fx_node.name}: writes into input {before.name} in place; the generated "
                "program leaves its inputs unchanged"
            )
        if not isinstance(after, Ref) or (isinstance(before, Ref) and module_state(before)):
            return  # a dropped buffer update, or state that outlives the call: not rebound
        for other in self.nodes:
            ref = env.get(other.name)
            if not isinstance(ref, Ref) or module_state(ref):
                continue
            if _same_tensor(other.meta.get("sg_value"), written):
                env[other.name] = after
                self.seen[other.name] = {s: self.versions[s] for s in _storages(written)}
        self.seen[mutated.name] = {s: self.versions[s] for s in _storages(written)}
        env[mutated.name] = after


def _is_buffer_update(fx_node: torch.fx.Node, env: dict[str, Any]) -> bool:
    if fx_node.op != "call_method" or not str(fx_node.target).endswith("_") or fx_node.users:
        return False
    first = fx_node.args[0] if fx_node.args else None
    ref = env.get(first.name) if isinstance(first, torch.fx.Node) else None
    # a module's buffer, not a constant the forward built (``torch.zeros(7, 5)`` to index_add_)
    return isinstance(ref, Ref) and module_state(ref)
