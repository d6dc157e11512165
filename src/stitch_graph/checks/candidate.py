"""Run the registered checks on a candidate: the entry point the Verifier calls.

A generated program can pass a correctness test and post a speedup without doing the work in CUDA:
it can call PyTorch, cache outputs across calls, return constants that happen to fall inside the
tolerance, branch on input values, patch the timer, or read the reference. Running such a program
wastes GPU time and, worse, rewards the trick. The checks read the host code's syntax tree and
the CUDA text and report what they find, so the Verifier can refuse the candidate (and a trainer can
use it as a negative) before anything runs.

The checks are heuristics: they aim to let an honest program through untouched and to catch the
known tricks, not to prove anything. Ops the candidate openly leaves to PyTorch
(``Candidate.declared_torch_ops``) are reported as declared uses, not as hacks.

This module knows no rule: it visits the scopes of :class:`~stitch_graph.checks.registry.Scope`
in order and calls whatever checks the registry holds for each.
"""

from __future__ import annotations

import ast
from typing import Any

from stitch_graph.artifacts import Candidate, HackReport
from stitch_graph.checks.context import CandidateContext, Findings
from stitch_graph.checks.registry import Registry, Scope
from stitch_graph.checks.rules import REGISTRY

__all__ = ["check_candidate"]


def check_candidate(
    candidate: Candidate,
    *,
    reference_source: str | None = None,
    reference_dtype: str | None = None,
    registry: Registry | None = None,
) -> HackReport:
    """Run every static hack check on ``candidate``.

    Args:
        candidate: The program to check; ``declared_torch_ops`` lists ops it may leave to
            PyTorch.
        reference_source: Text of the reference problem file; enables the copied-forward check
            and the inference of the reference precision.
        reference_dtype: Precision of the reference (``"float32"``, ``"float16"``, ...). When
            omitted it is inferred from ``reference_source`` and defaults to fp32.
        registry: The rules and checks to run; the built-in
            :data:`~stitch_graph.checks.REGISTRY` when omitted.

    Returns:
        A :class:`HackReport`; ``report.rejected`` says whether to refuse the candidate.
    """
    registry = REGISTRY if registry is None else registry
    out = Findings(active_rules=frozenset(registry.rules))
    ctx = CandidateContext.build(candidate, reference_source, reference_dtype)
    _run_scope(registry, Scope.CANDIDATE, ctx, out)
    host = ctx.host
    if host is not None:
        _run_scope(registry, Scope.MODULE, host, out, host.tree)
        if host.model is not None:
            _run_scope(registry, Scope.MODEL, host, out)
            if host.path:
                _run_scope(registry, Scope.FORWARD_PATH, host, out)
                for fn in host.functions():
                    _run_scope(registry, Scope.FUNCTION, fn, out, fn.node)
                for method in host.off_path_methods():
                    _run_scope(registry, Scope.METHOD, method, out)
    _run_scope(registry, Scope.CUDA_SOURCE, ctx, out)
    return HackReport(findings=out.findings, declared_uses=out.declared, notes=out.notes)


def _run_scope(
    registry: Registry,
    scope: Scope,
    context: Any,
    out: Findings,
    tree: ast.AST | None = None,
) -> None:
    """Run the checks of ``scope`` on ``context`` in registry order.

    Per-node checks share one walk of ``tree``, made where the first of them stands; while a
    check runs, ``out`` accepts only the rules it is registered for.
    """
    plan = registry._plan(scope)
    per_node = [(check, rules) for check, rules in plan if check.per_node]
    walked = False
    for check, rules in plan:
        if not check.per_node:
            out.allowed_rules = rules
            check.run(context, out)
        elif not walked and tree is not None:
            walked = True
            for node in ast.walk(tree):
                for node_check, node_rules in per_node:
                    out.allowed_rules = node_rules
                    node_check.run(node, context, out)
    out.allowed_rules = None
