"""Start a worker without importing ``stitch_graph/__init__.py``.

The package's top level pulls in LangGraph and LangChain (the graph, the checkpointers), which a
worker never uses: it would add most of a second to every candidate's start and fail outright on
machines that only hold the GPU stack. Run as a script, this file registers a bare
``stitch_graph`` package (its folder, no ``__init__``), then hands over to
``stitch_graph.execution.worker``.
"""

import sys
import types
from pathlib import Path

__all__: list[str] = []


def _register_bare_package() -> None:
    package_dir = Path(__file__).resolve().parents[1]
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # our own folder must not shadow top-level modules
    if "stitch_graph" not in sys.modules:
        bare = types.ModuleType("stitch_graph")
        bare.__path__ = [str(package_dir)]
        bare.__file__ = str(package_dir / "__init__.py")
        sys.modules["stitch_graph"] = bare
    parent = str(package_dir.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)


if __name__ == "__main__":
    import os

    _register_bare_package()
    from stitch_graph.execution.worker import main

    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
