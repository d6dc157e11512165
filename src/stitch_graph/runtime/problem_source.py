"""A problem's source run as an import would run it.

Problems are read from strings, not imported. Two things an import gives that ``exec`` alone
does not: the module in ``sys.modules`` (``@dataclass`` looks the class's module up there as it
decorates it) and the file's lines in ``linecache`` (``torch.jit.script`` and ``inspect`` read a
function's source through it).
"""

from __future__ import annotations

import linecache
import sys
import types
from typing import Any

__all__ = ["exec_problem", "remember_source"]


def remember_source(source: str, filename: str) -> None:
    """Make ``source`` the lines ``inspect`` finds for code compiled under ``filename``."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def exec_problem(source: str, filename: str, module_name: str) -> dict[str, Any]:
    """Run ``source`` as the module ``module_name`` (left in ``sys.modules``, so that what it
    defines can be looked up by module later); return its namespace."""
    remember_source(source, filename)
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    return module.__dict__
