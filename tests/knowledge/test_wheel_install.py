"""The corpus travels with the package: a wheel installed away from the source tree can search.

An editable install or a source checkout finds the corpus whatever the packaging says, so this
builds a real wheel, installs it into a temporary folder and searches from a fresh interpreter
that cannot see ``src/``. Nothing is fetched: the build uses the installed setuptools and pip
runs without an index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "src" / "stitch_graph" / "knowledge" / "entries").glob("*.md"))

CHILD = textwrap.dedent(
    """
    import json
    from pathlib import Path

    import stitch_graph.knowledge as knowledge
    from stitch_graph.knowledge import corpus, load_corpus, KnowledgeIndex

    root = corpus.knowledge_dir()
    index = KnowledgeIndex(include_user_documents=False)
    hits = index.search("cp.async double buffering to hide global load latency", k=3)
    print(json.dumps({
        "package": str(Path(knowledge.__file__).resolve()),
        "corpus_module": str(Path(corpus.__file__).resolve()),
        "corpus_dir": str(root.resolve()),
        "md_files": len(list(root.glob("*.md"))),
        "entries": len(load_corpus()),
        "indexed": len(index.entries),
        "hits": [h.id for h in hits],
    }))
    """
)


def _pip(command: str, *args: str, cwd: Path) -> None:
    """Run pip offline: no index, no version check, no prompts."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", command, "--no-index", "--no-deps", "-q", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_installed_wheel_ships_and_searches_the_corpus(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    assert SHIPPED, "no corpus entries in the source tree"

    # Build from a copy: an in-tree build would write build/ and egg-info into the checkout.
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src",
        project / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    wheels = tmp_path / "wheels"
    _pip("wheel", "--no-build-isolation", "-w", str(wheels), str(project), cwd=tmp_path)
    (wheel,) = wheels.glob("stitch_graph-*.whl")

    site = tmp_path / "site"
    _pip("install", "--target", str(site), str(wheel), cwd=tmp_path)

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STITCH_KNOWLEDGE_DIR")}
    env.update(
        PYTHONPATH=str(site),
        PYTHONNOUSERSITE="1",
        STITCH_CACHE_DIR=str(tmp_path / "cache"),
        STITCH_EMBEDDER="hashing",
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=empty, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])

    site = site.resolve()
    for key in ("package", "corpus_module", "corpus_dir"):
        assert Path(report[key]).is_relative_to(site), (key, report[key])
    assert report["md_files"] == len(SHIPPED)
    assert report["entries"] == report["indexed"] == len(SHIPPED)
    assert report["hits"][0] == "cp-async"
