"""The knowledge index: dense (FAISS) and keyword (BM25) retrieval over the corpus, fused.

Profiler and compiler findings are short and jargon-heavy ("ptxas: 256 bytes spill stores",
"__shfl_down is undefined"), so neither retriever alone is reliable: embeddings catch paraphrase,
BM25 with a CUDA-aware tokenizer catches exact identifiers. Both rankings are fused. Embedding the
corpus costs seconds, so the vector store (:mod:`stitch_graph.knowledge.store`) is cached on
disk, keyed by the corpus content and the embedder.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from stitch_graph.knowledge.corpus import (
    KnowledgeEntry,
    cache_root,
    corpus_fingerprint,
    load_corpus,
    load_user_entries,
)
from stitch_graph.knowledge.embeddings import Embedder, embedder_name, get_embedder
from stitch_graph.knowledge.store import VectorStore

__all__ = [
    "BM25",
    "KnowledgeHit",
    "KnowledgeIndex",
    "SearchMode",
    "default_index",
    "reset_default_index",
    "tokenize",
]

SearchMode = Literal["hybrid", "dense", "keyword"]
_MODES = ("hybrid", "dense", "keyword")

# Words that carry no retrieval signal in findings ("the kernel is at 92% of peak").
_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in into is it its of on or per so than that the "
    "their then there these this to was were when where which while with without what how why "
    "can does do not no use using used we you your our should would could".split()
)
# Identifiers with CUDA punctuation kept whole: __syncthreads, cp.async, sm_90a, ld.global.v4,
# -maxrregcount, #pragma; numbers with units stay as their digits.
_TOKEN = re.compile(r"[#\-]?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*|\d+(?:\.\d+)?")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+[a-z]*")


def _stem(word: str) -> str:
    if not word.isalpha() or len(word) <= 4:
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and not word.endswith("ss") and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Split text into BM25 terms, keeping CUDA jargon intact.

    A token like ``__shfl_down_sync`` yields itself plus its parts ``shfl``, ``down``, ``sync``;
    ``cudaFuncSetAttribute`` yields itself plus ``cuda``, ``func``, ``set``, ``attribute``;
    ``ld.global.v4`` yields itself plus ``ld``, ``global``, ``v4``. Plain words are lower-cased,
    stripped of stop words and lightly stemmed (``spills`` → ``spill``, ``coalesced`` →
    ``coalesc``).

    Args:
        text: Any text.

    Returns:
        The terms, in order, with duplicates.
    """
    out: list[str] = []
    for match in _TOKEN.finditer(text):
        raw = match.group(0)
        core = raw.lstrip("#-")
        lower = raw.lower()
        compound = bool(re.search(r"[_.]", core.strip("_"))) or bool(
            re.search(r"[a-z][A-Z]|[A-Za-z]\d|\d[A-Za-z]", core)
        )
        if lower.strip("#-_") in _STOPWORDS:
            continue
        if not compound:
            word = core.lower().strip("_")
            if raw.startswith(("#", "-")) or core.startswith("__"):
                out.append(lower)
            if word and word not in _STOPWORDS:
                out.append(_stem(word))
            continue
        out.append(lower)
        for part in re.split(r"[_.]+", core):
            for piece in _CAMEL.findall(part) or [part]:
                piece = piece.lower()
                if piece and piece not in _STOPWORDS and piece != lower:
                    out.append(_stem(piece))
    return out


class BM25:
    """Okapi BM25 over pre-tokenised documents (small, dependency-free)."""

    def __init__(self, documents: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75):
        """Index the documents.

        Args:
            documents: One token list per document.
            k1: Term-frequency saturation.
            b: Length normalisation.
        """
        self.k1, self.b = k1, b
        self.n = len(documents)
        self.lengths = np.array([len(d) for d in documents], dtype=np.float64)
        self.avg_len = float(self.lengths.mean()) if self.n else 0.0
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for doc_id, doc in enumerate(documents):
            for term, tf in Counter(doc).items():
                self.postings.setdefault(term, []).append((doc_id, tf))
        self.idf = {
            term: math.log(1.0 + (self.n - len(p) + 0.5) / (len(p) + 0.5))
            for term, p in self.postings.items()
        }

    def scores(self, query: Sequence[str]) -> np.ndarray:
        """BM25 score of every document for the query terms."""
        out = np.zeros(self.n, dtype=np.float64)
        if not self.n:
            return out
        norm = self.k1 * (1.0 - self.b + self.b * self.lengths / max(self.avg_len, 1e-9))
        for term, qtf in Counter(query).items():
            postings = self.postings.get(term)
            if not postings:
                continue
            idx = np.fromiter((d for d, _ in postings), dtype=np.int64, count=len(postings))
            tf = np.fromiter((t for _, t in postings), dtype=np.float64, count=len(postings))
            out[idx] += qtf * self.idf[term] * tf * (self.k1 + 1.0) / (tf + norm[idx])
        return out


class KnowledgeHit(BaseModel):
    """One search result."""

    id: str
    title: str
    score: float
    snippet: str = ""
    source: str = Field(default="", description="Path of the entry's file (or user document).")
    action: str = ""
    bottlenecks: list[str] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list, description="The entry's sources.")


def _clean_markdown(text: str) -> str:
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    text = re.sub(r"^#+\s*", "", text, flags=re.MULTILINE)
    text = re.sub(r"[`*]", "", text)
    return re.sub(r"\s+", " ", text).strip()


def snippet_of(entry: KnowledgeEntry, limit: int = 280) -> str:
    """The first prose paragraph of an entry, trimmed to ``limit`` characters."""
    for para in re.split(r"\n\s*\n", entry.body):
        para = para.strip()
        if not para or para.startswith("#") or para.startswith("```"):
            continue
        text = _clean_markdown(para)
        if len(text) <= limit:
            return text
        return text[: limit - 1].rsplit(" ", 1)[0] + "…"
    return ""


def _header_text(entry: KnowledgeEntry) -> str:
    parts = [entry.title, entry.action]
    if entry.metrics:
        parts.append("Signals: " + ", ".join(entry.metrics))
    if entry.keywords:
        parts.append("Keywords: " + ", ".join(entry.keywords))
    return ". ".join(p for p in parts if p)


def _dense_chunks(entry: KnowledgeEntry, words: int = 110) -> list[str]:
    """Texts embedded for one entry: a header of title/signals/keywords, then body windows."""
    chunks = [_header_text(entry)]
    body_words = _clean_markdown(entry.body).split()
    if body_words and body_words[: len(entry.title.split())] == entry.title.split():
        body_words = body_words[len(entry.title.split()) :]
    step = max(words - 20, 1)
    for start in range(0, len(body_words), step):
        window = body_words[start : start + words]
        if len(window) < 25 and start:
            break
        chunks.append(f"{entry.title}: " + " ".join(window))
    return chunks


def _keyword_text(entry: KnowledgeEntry) -> str:
    fields = [entry.title, entry.title, entry.action, " ".join(entry.keywords)]
    fields += [" ".join(entry.keywords), " ".join(entry.metrics), entry.body]
    return "\n".join(fields)


def _minmax(scores: np.ndarray) -> np.ndarray:
    finite = np.where(np.isfinite(scores), scores, np.nan)
    if np.all(np.isnan(finite)):
        return np.zeros_like(scores)
    lo, hi = np.nanmin(finite), np.nanmax(finite)
    if hi - lo <= 1e-12:
        return np.where(np.isnan(finite), 0.0, 1.0 if hi > 0 else 0.0)
    return np.nan_to_num((finite - lo) / (hi - lo), nan=0.0)


class KnowledgeIndex:
    """Hybrid retrieval over the knowledge corpus and user documents.

    Construction is cheap; the corpus is parsed and the vector store built or loaded from the
    disk cache on the first :meth:`search` (or an explicit :meth:`load`). Safe to share between
    threads.
    """

    def __init__(
        self,
        corpus_dir: Path | str | None = None,
        embedder: Embedder | None = None,
        cache_dir: Path | str | None = None,
        include_user_documents: bool = True,
        fusion: Literal["score", "rrf"] = "score",
        dense_weight: float = 0.5,
        keyword_weight: float = 1.0,
        rrf_k: float = 10.0,
    ) -> None:
        """Configure the index.

        Args:
            corpus_dir: Corpus folder; defaults to ``$STITCH_KNOWLEDGE_DIR`` or the corpus
                shipped in the package (:func:`~stitch_graph.knowledge.corpus.knowledge_dir`).
            embedder: Anything with ``embed_documents`` and ``embed_query`` returning unit
                vectors (a LangChain ``Embeddings`` will do); defaults to :func:`get_embedder`
                (MiniLM if installed).
            cache_dir: Where cached stores live; defaults to ``$STITCH_CACHE_DIR/knowledge`` or
                ``~/.cache/stitch-graph/knowledge``. Each corpus+embedder gets a sub-folder.
            include_user_documents: Also index documents added with ``add_documents``.
            fusion: ``"score"`` adds min-max normalised dense and BM25 scores; ``"rrf"`` adds
                reciprocal ranks. Score fusion (dense weight 0.5) did best on the labelled
                queries (``tools/eval_knowledge.py``): it keeps BM25's confident margins on exact
                identifiers while letting the embeddings break ties and catch paraphrase.
            dense_weight: Weight of the dense part in fusion.
            keyword_weight: Weight of the BM25 part in fusion.
            rrf_k: Reciprocal-rank-fusion constant (``fusion="rrf"`` only).
        """
        self.corpus_dir = Path(corpus_dir) if corpus_dir is not None else None
        self._embedder = embedder
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.include_user_documents = include_user_documents
        if fusion not in ("score", "rrf"):
            msg = f"unknown fusion {fusion!r}; use 'score' or 'rrf'"
            raise ValueError(msg)
        self.fusion = fusion
        self.rrf_k = rrf_k
        self.dense_weight = dense_weight
        self.keyword_weight = keyword_weight
        self._lock = threading.RLock()
        self._loaded = False
        self.entries: list[KnowledgeEntry] = []
        self.loaded_from_cache = False
        self.store_path: Path | None = None
        self._store: VectorStore | None = None
        self._bm25: BM25 | None = None

    # ---------------------------------------------------------------------------------- loading

    @property
    def embedder(self) -> Embedder:
        """The embedder (chosen on first access)."""
        if self._embedder is None:
            self._embedder = get_embedder()
        return self._embedder

    @property
    def embedder_name(self) -> str:
        """Name of the embedder, as used in the cache key."""
        return embedder_name(self.embedder)

    def load(self) -> KnowledgeIndex:
        """Parse the corpus and build or load the vector store; idempotent.

        Returns:
            ``self``, for chaining.
        """
        with self._lock:
            if self._loaded:
                return self
            entries = load_corpus(self.corpus_dir)
            if self.include_user_documents:
                entries += load_user_entries()
            self._open(entries)
            self._loaded = True
        return self

    def reload(self) -> KnowledgeIndex:
        """Forget what was loaded and load again (after the corpus or documents changed)."""
        with self._lock:
            self._loaded = False
            return self.load()

    def _open(self, entries: list[KnowledgeEntry]) -> None:
        texts: list[str] = []
        owners: list[int] = []
        for i, entry in enumerate(entries):
            for chunk in _dense_chunks(entry):
                texts.append(chunk)
                owners.append(i)
        name = self.embedder_name
        key = hashlib.sha256(f"{corpus_fingerprint(entries)}\0{name}".encode()).hexdigest()[:20]
        root = self._cache_dir if self._cache_dir is not None else cache_root()
        path = root / f"index-{key}"
        manifest = {
            "key": key,
            "embedder": name,
            "entries": len(entries),
            "chunks": len(texts),
        }
        store = VectorStore.load(path, manifest, texts, owners)
        self.loaded_from_cache = store is not None
        if store is None:
            vectors = self.embedder.embed_documents(texts) if texts else []
            store = VectorStore.from_vectors(vectors, texts, owners)
            store.save(path, manifest)
        self.entries = entries
        self._store = store
        self._bm25 = BM25([tokenize(_keyword_text(e)) for e in entries])
        self.store_path = path

    # ---------------------------------------------------------------------------------- search

    def get(self, entry_id: str) -> KnowledgeEntry:
        """The entry with this id.

        Raises:
            KeyError: No such entry.
        """
        self.load()
        for entry in self.entries:
            if entry.id == entry_id:
                return entry
        msg = f"no knowledge entry with id {entry_id!r}"
        raise KeyError(msg)

    def _dense_scores(self, query: str) -> np.ndarray:
        assert self._store is not None
        return self._store.entry_scores(self.embedder.embed_query(query), len(self.entries))

    def _keyword_scores(self, query: str) -> np.ndarray:
        assert self._bm25 is not None
        return self._bm25.scores(tokenize(query))

    def scores(self, query: str, mode: SearchMode = "hybrid") -> np.ndarray:
        """Score every entry for the query (higher is better), in ``self.entries`` order.

        Args:
            query: Free text: a profiler finding, a compiler message, a question.
            mode: ``"hybrid"`` (fusion of both), ``"dense"`` (cosine) or ``"keyword"`` (BM25).

        Returns:
            One score per entry.

        Raises:
            ValueError: Unknown mode.
        """
        if mode not in _MODES:
            msg = f"unknown search mode {mode!r}; use one of {_MODES}"
            raise ValueError(msg)
        self.load()
        if mode == "dense":
            return self._dense_scores(query)
        if mode == "keyword":
            return self._keyword_scores(query)
        dense = self._dense_scores(query)
        keyword = self._keyword_scores(query)
        if self.fusion == "rrf":
            fused = np.zeros(len(self.entries))
            for weight, part in ((self.dense_weight, dense), (self.keyword_weight, keyword)):
                order = np.argsort(-part, kind="stable")
                ranks = np.empty(len(part))
                ranks[order] = np.arange(1, len(part) + 1)
                contribution = weight / (self.rrf_k + ranks)
                contribution[~np.isfinite(part) | (part <= 0)] = 0.0
                fused += contribution
            return fused
        return self.dense_weight * _minmax(dense) + self.keyword_weight * _minmax(keyword)

    def search(
        self,
        query: str,
        k: int = 3,
        mode: SearchMode = "hybrid",
        bottlenecks: Iterable[str] | None = None,
    ) -> list[KnowledgeHit]:
        """The ``k`` best entries for a query.

        Args:
            query: Free text: a profiler finding, a compiler message, a question.
            k: How many hits.
            mode: ``"hybrid"``, ``"dense"`` or ``"keyword"``.
            bottlenecks: If given, only entries tagged with one of these (user documents, which
                carry no tags, always pass).

        Returns:
            Hits, best first; entries with no signal at all are left out.
        """
        if k <= 0 or not query.strip():
            return []
        scores = self.scores(query, mode)
        wanted = set(bottlenecks) if bottlenecks is not None else None
        hits: list[KnowledgeHit] = []
        for i in np.argsort(-scores, kind="stable"):
            score = float(scores[i])
            if not math.isfinite(score) or (mode != "dense" and score <= 0):
                break
            entry = self.entries[int(i)]
            if wanted is not None and entry.bottlenecks and not wanted & set(entry.bottlenecks):
                continue
            hits.append(
                KnowledgeHit(
                    id=entry.id,
                    title=entry.title,
                    score=round(score, 6),
                    snippet=snippet_of(entry),
                    source=entry.path,
                    action=entry.short_action,
                    bottlenecks=entry.bottlenecks,
                    metrics=entry.metrics,
                    references=entry.sources,
                )
            )
            if len(hits) >= k:
                break
        return hits


_default: KnowledgeIndex | None = None
_default_lock = threading.Lock()


def default_index() -> KnowledgeIndex:
    """The process-wide index, loaded on first call (thread-safe; later calls are free)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = KnowledgeIndex().load()
        return _default


def reset_default_index() -> None:
    """Drop the process-wide index so the next :func:`default_index` loads afresh."""
    global _default
    with _default_lock:
        _default = None
