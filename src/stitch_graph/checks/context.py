"""What a check is handed: the part of the candidate it looks at, and where to report.

Each scope of the registry (see :mod:`stitch_graph.checks.registry`) passes its checks one kind
of context. The contexts compute the shared analyses (name resolution, ModelNew, the forward
path, tensor inference) once, on first use, so that checks stay independent of each other and
of the order in which the runner calls them. :class:`Findings` collects what the checks report.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property

from stitch_graph.artifacts import Candidate, HackFinding
from stitch_graph.checks.external import ExternalProgram, find_external_program
from stitch_graph.checks.forward import (
    _Analyzer,
    _find_model,
    _forward_analyzers,
    _forward_path,
    _Function,
    _launching_functions,
    _ModelInfo,
    _module_vars,
    _test_nodes,
    _test_roots,
)
from stitch_graph.checks.names import _Names
from stitch_graph.checks.opnames import op_keys

__all__ = ["CandidateContext", "Findings", "FunctionContext", "HostContext", "MethodContext"]


def _reference_is_fp32(reference_source: str | None, reference_dtype: str | None) -> bool:
    """Whether the reference computes in fp32: as given, else guessed from its text."""
    if reference_dtype:
        return reference_dtype in {"float32", "fp32", "float", "torch.float32"}
    if reference_source and re.search(r"float16|bfloat16|\.half\(\)|torch\.half", reference_source):
        return False
    return True


@dataclass
class Findings:
    """Findings and declared uses, de-duplicated by rule and host line.

    A finding with a line is kept once per ``(rule, line)``: the first detail reported wins. One
    without a line is kept once per ``(rule, detail)``.

    Attributes:
        findings: Hack findings in the order they were first reported.
        notes: Informational ``declared_torch_op`` findings.
        declared: Declared torch ops the forward path actually uses, in first-use order.
        active_rules: The registered rules; findings of any other rule are dropped (None: keep
            all).
        allowed_rules: The registered rules the check now running is registered for (None:
            any); reporting another registered rule is an error in that check.
    """

    findings: list[HackFinding] = field(default_factory=list)
    notes: list[HackFinding] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)
    active_rules: frozenset[str] | None = None
    allowed_rules: frozenset[str] | None = None
    _seen: set[tuple[str, int | None, str]] = field(default_factory=set)

    def _accepts(self, rule: str) -> bool:
        if self.active_rules is not None and rule not in self.active_rules:
            return False
        if self.allowed_rules is not None and rule not in self.allowed_rules:
            raise ValueError(f"a check raised rule {rule!r}, which it is not registered for")
        return True

    def add(self, rule: str, detail: str, node: ast.AST | None = None) -> None:
        """Report a finding located at ``node`` in the host code (or nowhere, if None)."""
        if not self._accepts(rule):
            return
        line = getattr(node, "lineno", None) if node is not None else None
        key = (rule, line, "" if line is not None else detail)
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(HackFinding(rule=rule, detail=detail, line=line))

    def add_at_line(self, rule: str, detail: str, line: int) -> None:
        """Report a finding at a line of another text than the host code (the CUDA source).

        It is kept as reported: a host finding of the same rule on the same line number is a
        different place and must not hide it.
        """
        if self._accepts(rule):
            self.findings.append(HackFinding(rule=rule, detail=detail, line=line))

    def declare(self, op: str, detail: str, node: ast.AST | None = None) -> None:
        """Note a use of ``op``, which the candidate declares it leaves to PyTorch."""
        if not self._accepts("declared_torch_op"):
            return
        line = getattr(node, "lineno", None) if node is not None else None
        key = ("declared_torch_op", line, detail)
        if key in self._seen:
            return
        self._seen.add(key)
        self.notes.append(HackFinding(rule="declared_torch_op", detail=detail, line=line))
        if op not in self.declared:
            self.declared.append(op)


@dataclass
class CandidateContext:
    """The whole candidate: handed to checks of the ``CANDIDATE`` and ``CUDA_SOURCE`` scopes.

    Attributes:
        candidate: The program under check.
        reference_source: Text of the reference problem file, when the caller has it.
        fp32_reference: Whether the reference computes in fp32 (half precision is then a
            downgrade).
        declared_ops: :func:`~stitch_graph.checks.op_key` keys of the candidate's
            ``declared_torch_ops``.
        tree: The parsed host code; None when it does not parse.
        syntax_error: Why the host code does not parse; None when it does.
    """

    candidate: Candidate
    reference_source: str | None
    fp32_reference: bool
    declared_ops: set[str]
    tree: ast.Module | None
    syntax_error: SyntaxError | None

    @classmethod
    def build(
        cls,
        candidate: Candidate,
        reference_source: str | None = None,
        reference_dtype: str | None = None,
    ) -> CandidateContext:
        """Parse the host code and settle the reference precision and declared ops."""
        try:
            tree: ast.Module | None = ast.parse(candidate.host_source)
            error = None
        except SyntaxError as exc:
            tree, error = None, exc
        return cls(
            candidate=candidate,
            reference_source=reference_source,
            fp32_reference=_reference_is_fp32(reference_source, reference_dtype),
            declared_ops=op_keys(candidate.declared_torch_ops),
            tree=tree,
            syntax_error=error,
        )

    @cached_property
    def host(self) -> HostContext | None:
        """The parsed host module, or None when the host code does not parse."""
        return None if self.tree is None else HostContext(self, self.tree)


class HostContext:
    """The parsed host module: handed to ``MODULE``, ``MODEL`` and ``FORWARD_PATH`` checks.

    Args:
        candidate: The candidate the module belongs to.
        tree: Its parsed host code.
    """

    def __init__(self, candidate: CandidateContext, tree: ast.Module) -> None:
        self.candidate = candidate
        self.tree = tree

    @cached_property
    def names(self) -> _Names:
        """Imported names and simple aliases of the module."""
        return _Names(self.tree)

    @cached_property
    def external(self) -> ExternalProgram:
        """What the file builds itself (CuPy kernels, load_inline, ctypes libraries)."""
        return find_external_program(self.tree, self.names)

    @cached_property
    def model(self) -> _ModelInfo | None:
        """The module-level ``ModelNew`` class, or None."""
        return _find_model(self.tree, self.names, self.external)

    @cached_property
    def path(self) -> dict[str, _Function]:
        """Forward and every function it reaches, forward first; empty without forward."""
        return {} if self.model is None else _forward_path(self.tree, self.model)

    @cached_property
    def analyzers(self) -> dict[str, _Analyzer]:
        """A tensor analyzer per forward-path function, keyed like :attr:`path`."""
        if self.model is None or not self.path:
            return {}
        return _forward_analyzers(self.path, self.model, self.names)

    @cached_property
    def launching(self) -> set[str]:
        """Keys of forward-path functions that launch a kernel, directly or through a helper."""
        return _launching_functions(self.analyzers)

    @cached_property
    def module_vars(self) -> set[str]:
        """Names bound at module level, where state can outlive a call."""
        return _module_vars(self.tree, self.external.launcher_names)

    def functions(self) -> list[FunctionContext]:
        """The forward-path functions, forward first."""
        return [FunctionContext(key, an, self) for key, an in self.analyzers.items()]

    def off_path_methods(self) -> list[MethodContext]:
        """ModelNew's methods that the forward path neither calls nor refers to."""
        if self.model is None:
            return []
        return [
            MethodContext(name, method, self)
            for name, method in self.model.methods.items()
            if name not in {"forward"} and f"self.{name}" not in self.path
        ]


@dataclass
class FunctionContext:
    """One forward-path function: handed to ``FUNCTION`` checks.

    Attributes:
        key: ``"forward"``, ``"self.<method>"`` or the module function's name.
        an: Its tensor analyzer.
        host: The module it belongs to.
    """

    key: str
    an: _Analyzer
    host: HostContext

    @property
    def node(self) -> ast.FunctionDef | ast.AsyncFunctionDef:
        """The function's definition."""
        return self.an.fn.node

    @property
    def is_forward(self) -> bool:
        """Whether this is ``ModelNew.forward`` itself."""
        return self.key == "forward"

    @cached_property
    def test_node_ids(self) -> set[int]:
        """``id()`` of every node inside a condition (if, while, assert, filters, and/or)."""
        return _test_nodes(self.node)

    @cached_property
    def test_roots(self) -> list[ast.AST]:
        """The conditions of if, while, assert, conditional expressions and filters."""
        return _test_roots(self.node)


@dataclass
class MethodContext:
    """A ModelNew method off the forward path: handed to ``METHOD`` checks.

    Attributes:
        name: The method's name.
        node: Its definition.
        host: The module it belongs to.
    """

    name: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    host: HostContext
