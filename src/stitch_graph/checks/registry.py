"""The registry of hack rules and of the checks that raise them.

A rule is a name and a description (what :data:`~stitch_graph.checks.HACK_RULES` lists); a check
is a function that looks at one scope of a candidate and reports findings. A rule is registered
once, with every check that can raise it; a check may serve several rules. The runner
(:func:`~stitch_graph.checks.check_candidate`) only walks the scopes in order and calls the
registered checks, so a new rule needs a check function and one :meth:`Registry.register` call,
nothing wired by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Check", "Registry", "Rule", "Scope"]


class Scope(enum.Enum):
    """Where a check looks, listed in the order the runner visits them.

    Each scope hands its checks one context (see :mod:`stitch_graph.checks.context`):

    * ``CANDIDATE``: the whole candidate (:class:`CandidateContext`), before the host code is
      analysed; its syntax tree may be missing.
    * ``MODULE``: the parsed host module (:class:`HostContext`), when it parses.
    * ``MODEL``: the same context, when the module defines ModelNew.
    * ``FORWARD_PATH``: the same context, when ModelNew has a forward.
    * ``FUNCTION``: each function on the forward path (:class:`FunctionContext`), forward first.
    * ``METHOD``: each ModelNew method off the forward path (:class:`MethodContext`).
    * ``CUDA_SOURCE``: the whole candidate again, for its CUDA text, after all host checks.
    """

    CANDIDATE = "candidate"
    MODULE = "module"
    MODEL = "model"
    FORWARD_PATH = "forward_path"
    FUNCTION = "function"
    METHOD = "method"
    CUDA_SOURCE = "cuda_source"


# Scopes whose context has a syntax tree a per-node check can be run over.
_WALKABLE = frozenset({Scope.MODULE, Scope.FUNCTION})


@dataclass(frozen=True)
class Check:
    """A check function and the scope it runs at.

    A check is called as ``run(context, findings)``. A per-node check is called as
    ``run(node, context, findings)`` for every node of the scope's syntax tree (the host module,
    or one function) in :func:`ast.walk` order. The per-node checks of a scope share a single
    walk, made where the first of them stands in the run order, so their findings interleave node
    by node.

    Attributes:
        name: A short identifier, unique within a registry.
        scope: Where the check runs.
        run: The check function.
        per_node: Whether ``run`` is called per syntax-tree node (``MODULE`` and ``FUNCTION``
            scopes only).
    """

    name: str
    scope: Scope
    run: Callable[..., None]
    per_node: bool = False

    def __post_init__(self) -> None:
        if self.per_node and self.scope not in _WALKABLE:
            raise ValueError(f"check {self.name!r}: scope {self.scope.value} has no syntax tree")


@dataclass(frozen=True)
class Rule:
    """A kind of hack the checks report.

    Attributes:
        name: The rule name findings carry (``"torch_compute"``).
        description: What the rule means, for reports and prompts.
    """

    name: str
    description: str


class Registry:
    """Rules, the checks that raise them, and the order in which the checks run.

    Within a scope, checks run in the order they first became known to the registry (through
    :meth:`schedule` or :meth:`register`); that order is also the order of the findings.
    """

    def __init__(self) -> None:
        self._rules: dict[str, Rule] = {}
        self._raised_by: dict[str, tuple[Check, ...]] = {}
        self._order: list[Check] = []
        self._plans: dict[Scope, tuple[tuple[Check, frozenset[str]], ...]] = {}

    def schedule(self, *checks: Check) -> None:
        """Fix the run order of ``checks`` ahead of registering the rules they raise.

        A check runs only once some registered rule names it; scheduling alone runs nothing.
        """
        for check in checks:
            self._add_check(check)
        self._plans.clear()

    def register(self, rule: Rule, *checks: Check) -> None:
        """Register ``rule`` with every check that can raise it.

        Checks not yet known run after those already registered in their scope.

        Raises:
            ValueError: The rule is already registered, no check is given, or another check
                already uses one of the names.
        """
        if rule.name in self._rules:
            raise ValueError(f"rule {rule.name!r} is already registered")
        if not checks:
            raise ValueError(f"rule {rule.name!r} needs at least one check that raises it")
        for check in checks:
            self._check_name_free(check)
        for check in checks:
            self._add_check(check)
        self._rules[rule.name] = rule
        self._raised_by[rule.name] = tuple(dict.fromkeys(checks))
        self._plans.clear()

    def unregister(self, name: str) -> Rule:
        """Remove a rule; checks that raise nothing else stop running.

        Returns:
            The removed rule.

        Raises:
            KeyError: No rule of that name is registered.
        """
        rule = self._rules.pop(name)
        del self._raised_by[name]
        self._plans.clear()
        return rule

    def copy(self) -> Registry:
        """An independent registry with the same rules, checks and order."""
        twin = Registry()
        twin._rules = dict(self._rules)
        twin._raised_by = dict(self._raised_by)
        twin._order = list(self._order)
        return twin

    @property
    def rules(self) -> dict[str, Rule]:
        """The registered rules by name, in registration order."""
        return dict(self._rules)

    def checks_raising(self, rule: str) -> tuple[Check, ...]:
        """The checks registered for ``rule``."""
        return self._raised_by[rule]

    def rules_of(self, check: Check) -> frozenset[str]:
        """The registered rules that ``check`` may raise."""
        return frozenset(name for name, checks in self._raised_by.items() if check in checks)

    def checks(self, scope: Scope | None = None) -> list[Check]:
        """Checks that serve a registered rule, in run order (of one scope, or all)."""
        serving = {check for checks in self._raised_by.values() for check in checks}
        return [
            check
            for check in self._order
            if check in serving and (scope is None or check.scope is scope)
        ]

    def descriptions(self) -> dict[str, str]:
        """Rule name to description, sorted by name."""
        return {name: self._rules[name].description for name in sorted(self._rules)}

    def _plan(self, scope: Scope) -> tuple[tuple[Check, frozenset[str]], ...]:
        """:meth:`checks` of ``scope`` with :meth:`rules_of` each, kept until a change."""
        plan = self._plans.get(scope)
        if plan is None:
            plan = tuple((check, self.rules_of(check)) for check in self.checks(scope))
            self._plans[scope] = plan
        return plan

    def _check_name_free(self, check: Check) -> None:
        if check not in self._order and any(c.name == check.name for c in self._order):
            raise ValueError(f"another check is already registered as {check.name!r}")

    def _add_check(self, check: Check) -> None:
        self._check_name_free(check)
        if check not in self._order:
            self._order.append(check)
