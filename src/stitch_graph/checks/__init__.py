"""Checks the Verifier runs on a candidate: static hack detection before anything executes.

:func:`check_candidate` runs every check of a :class:`Registry` (the built-in
:data:`REGISTRY` by default) and returns a :class:`HackReport`. A new rule is a check function
plus one :meth:`Registry.register` call; :data:`HACK_RULES` lists the built-in rules.
"""

from stitch_graph.artifacts import HackReport
from stitch_graph.checks.candidate import check_candidate
from stitch_graph.checks.context import (
    CandidateContext,
    Findings,
    FunctionContext,
    HostContext,
    MethodContext,
)
from stitch_graph.checks.opnames import bare_op_name, op_key, op_keys
from stitch_graph.checks.registry import Check, Registry, Rule, Scope
from stitch_graph.checks.rules import HACK_RULES, REGISTRY, builtin_registry

__all__ = [
    "HACK_RULES",
    "REGISTRY",
    "CandidateContext",
    "Check",
    "Findings",
    "FunctionContext",
    "HackReport",
    "HostContext",
    "MethodContext",
    "Registry",
    "Rule",
    "Scope",
    "bare_op_name",
    "builtin_registry",
    "check_candidate",
    "op_key",
    "op_keys",
]
