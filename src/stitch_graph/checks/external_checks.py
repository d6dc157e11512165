"""Checks of the builds an external program makes itself (see :mod:`stitch_graph.checks.external`).

A CuPy raw kernel, a ``load_inline`` extension or an nvcc-built library is an honest launch only
when the CUDA it runs is text in the file: then the kernel checks can read it. A build the checks
cannot read, extension C++ that computes with ATen, and CuPy or NumPy routines in the forward
path do the work somewhere the checks do not look, so they are reported here.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from stitch_graph.checks.external import cpp_compute_calls
from stitch_graph.checks.names import _has_prefix
from stitch_graph.checks.vocabulary import (
    _ARRAY_ALLOWED_PREFIXES,
    _ARRAY_LIBRARY_ROOTS,
    _COMPUTE_METHODS,
)

if TYPE_CHECKING:
    from stitch_graph.checks.context import Findings, FunctionContext, HostContext


def _check_opaque_builds(host: HostContext, out: Findings) -> None:
    """Builds whose code is not readable CUDA text, and libraries the file does not build."""
    external = host.external
    for build in external.builds:
        if build.problem:
            out.add("opaque_build", build.problem, build.node)
        elif build.kind == "library" and not build.trusted and not external.nvcc_built:
            out.add(
                "opaque_build",
                "loads a shared library that the file does not build from its own CUDA "
                "text with nvcc",
                build.node,
            )


def _check_extension_compute(host: HostContext, out: Findings) -> None:
    """``load_inline`` C++ that computes with ATen ops or tensor methods on the host side."""
    for build in host.external.builds:
        if build.kind != "load_inline" or not build.text:
            continue
        calls = cpp_compute_calls(build.text, _COMPUTE_METHODS)
        if calls:
            shown = ", ".join(calls[:4])
            out.add(
                "extension_torch_compute",
                f"the extension's C++ computes with PyTorch: {shown}",
                build.node,
            )


def _check_library_compute(node: ast.AST, fn: FunctionContext, out: Findings) -> None:
    """CuPy, NumPy or SciPy routines called in the forward path (per node)."""
    if not isinstance(node, ast.Call):
        return
    dotted = fn.an.names.dotted(node.func)
    if not dotted or dotted.split(".")[0] not in _ARRAY_LIBRARY_ROOTS:
        return
    if _has_prefix(dotted, _ARRAY_ALLOWED_PREFIXES) or fn.an.is_launch(node):
        return
    out.add("library_compute", f"{dotted}() computes in the forward path", node)
