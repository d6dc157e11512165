"""Checks that the host code has the shape every other check relies on.

The host code must parse, and define a module-level ``ModelNew`` with a ``forward``. When it
does not, nothing about its forward path can be judged: these checks say so, and the runner
skips the scopes that need the missing part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stitch_graph.checks.context import CandidateContext, Findings, HostContext


def _check_host_parses(ctx: CandidateContext, out: Findings) -> None:
    """Host code that is not valid Python."""
    if ctx.syntax_error is not None:
        out.add("host_syntax_error", f"host code does not parse: {ctx.syntax_error.msg}")


def _check_model_defined(host: HostContext, out: Findings) -> None:
    """No ``ModelNew`` class at module level."""
    if host.model is None:
        out.add("missing_model_new", "no class ModelNew at module level")


def _check_forward_defined(host: HostContext, out: Findings) -> None:
    """A ``ModelNew`` without a ``forward`` method."""
    if host.model is not None and not host.path:
        out.add("missing_model_new", "ModelNew has no forward method", host.model.cls)
