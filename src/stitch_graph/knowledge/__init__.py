"""The knowledge index: CUDA optimisation advice retrieved for profiler and compiler findings.

The Verifier knows what a profile or a build says; this package knows what to do about it. A
reviewed Markdown corpus (``entries/`` in this package, shipped as package data) plus user
documents are indexed with MiniLM embeddings (FAISS) and CUDA-aware BM25, fused;
:func:`advice_for_profile` and :func:`advice_for_compile` turn findings into feedback items citing
``knowledge:<id>``. Agent frameworks stay out of this package: embedders are plain objects with
``embed_documents``/``embed_query`` (:class:`Embedder`), and the search is a plain function.
"""

from stitch_graph.knowledge.advice import advice_for_compile, advice_for_profile
from stitch_graph.knowledge.corpus import KnowledgeEntry, knowledge_dir, load_corpus
from stitch_graph.knowledge.documents import AddReport, add_documents
from stitch_graph.knowledge.embeddings import (
    Embedder,
    HashingEmbeddings,
    MiniLMEmbeddings,
    get_embedder,
)
from stitch_graph.knowledge.index import (
    KnowledgeHit,
    KnowledgeIndex,
    default_index,
    reset_default_index,
)
from stitch_graph.knowledge.tool import search_cuda_knowledge

__all__ = [
    "AddReport",
    "Embedder",
    "HashingEmbeddings",
    "KnowledgeEntry",
    "KnowledgeHit",
    "KnowledgeIndex",
    "MiniLMEmbeddings",
    "add_documents",
    "advice_for_compile",
    "advice_for_profile",
    "default_index",
    "get_embedder",
    "knowledge_dir",
    "load_corpus",
    "reset_default_index",
    "search_cuda_knowledge",
]
