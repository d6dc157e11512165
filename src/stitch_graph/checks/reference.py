"""What the checks take from the reference problem: its precision and its forward body.

A candidate that carries the reference's forward verbatim computes in PyTorch whatever else it
launches, and a half-precision candidate is a downgrade only against an fp32 reference. Both
need the reference's text, which callers pass when they have it.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stitch_graph.checks.context import Findings, HostContext


def _check_copied_reference(host: HostContext, out: Findings) -> None:
    """ModelNew holding the reference's forward body verbatim (whitespace aside)."""
    reference_source = host.candidate.reference_source
    model = host.model
    if not reference_source or model is None:
        return
    body = _forward_body_text(reference_source)
    if not body or len(body) < 12:
        return
    mine = re.sub(r"\s+", "", ast.unparse(model.cls))
    if body in mine:
        out.add(
            "reference_access", "ModelNew contains the reference's forward body verbatim", model.cls
        )


def _forward_body_text(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    body = list(item.body)
                    if (
                        body
                        and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant)
                    ):
                        body = body[1:]
                    text = "\n".join(ast.unparse(s) for s in body)
                    return re.sub(r"\s+", "", text)
    return None
