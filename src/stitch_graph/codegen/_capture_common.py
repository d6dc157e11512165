"""Common subexpressions: a value the forward computes twice from the same operands is computed
once.

Hand-written models repeat themselves: ``x.mean(-1)`` in two places, ``torch.sigmoid(g)`` in
the gate and again in the output, a mask built for each head. A repeated pointwise op costs a
few instructions once fused, but a repeated reduction, GEMM or convolution costs a whole pass
over memory. Only pure ops merge: random ops, uninitialised factories, guards and whatever
stays in PyTorch keep their separate calls.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen._capture_base import _rewire
from stitch_graph.codegen._capture_guards import GUARD_OP
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import UNSUPPORTED, lookup

# attributes that note where a node came from, not what it computes
_NOTES = frozenset({"row_lse_of"})
_IMPURE_WORDS = ("rand", "dropout", "bernoulli", "normal", "uniform", "empty", "multinomial")


def _pure(node: OpNode) -> bool:
    """Whether two calls of ``node``'s op on the same operands give the same values."""
    info = lookup(node.op)
    return (
        info is not None
        and info.kind != UNSUPPORTED
        and node.op != GUARD_OP
        and not any(word in node.op for word in _IMPURE_WORDS)
        and bool(node.tensor_refs())  # factories are cheap, and may be written in place
    )


def _key(node: OpNode) -> str:
    """Everything that decides ``node``'s value, as text (``repr`` keeps ``Ref``, dtypes and
    nested lists apart). The arguments as bound, defaults filled in, decide it; how the call
    was spelled, or which decomposition made it, does not (a softmax's and a cross entropy's
    logsumexp of the same logits)."""
    attrs = sorted((k, v) for k, v in node.attrs.items() if k not in _NOTES)
    parts: tuple[Any, ...] = (node.op, node.args, node.shape, node.dtype, attrs)
    return repr(parts)


def merge_common_subexpressions(ir: ProgramIR) -> None:
    """Drop every pure node that repeats an earlier one; its readers and the outputs read the
    earlier node. One walk in program order suffices: a node's operands are merged before
    the node itself is compared."""
    first: dict[str, str] = {}
    swap: dict[Ref, Ref] = {}
    kept: list[OpNode] = []
    for node in ir.nodes:
        if swap:
            _rewire(node, swap)
        if not _pure(node):
            kept.append(node)
            continue
        key = _key(node)
        if key in first:
            swap[Ref("node", node.name)] = Ref("node", first[key])
            continue
        first[key] = node.name
        kept.append(node)
    if swap:
        ir.nodes = kept
        ir.outputs = [swap.get(ref, ref) for ref in ir.outputs]
