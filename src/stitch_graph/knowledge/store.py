"""The dense half of the knowledge index: chunk vectors in FAISS, cached on disk without pickle.

Embedding the corpus costs seconds, so the vectors are kept on disk between processes: the FAISS
index through ``faiss.write_index``, and next to it the chunk texts and the entry each chunk
belongs to as JSON. Neither file can run code when read back, and a manifest holding their
SHA-256 digests vouches that a folder was written whole by this module for the expected corpus
and embedder; a folder that does not match is rebuilt, never patched up.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

__all__ = ["INDEX_FORMAT", "VectorStore"]

INDEX_FORMAT = "stitch-graph-knowledge-index/2"
"""Written into every manifest; a folder written in another format is rebuilt."""

_INDEX_FILE = "index.faiss"
_CHUNKS_FILE = "chunks.json"
_MANIFEST_FILE = "manifest.json"
_DATA_FILES = (_INDEX_FILE, _CHUNKS_FILE)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class VectorStore:
    """Chunk vectors in an exact inner-product index, each chunk tagged with its entry.

    The embedders return unit vectors, so the inner product is the cosine similarity. An exact
    (flat) index is used because the corpus is a few hundred chunks: every query scores every
    chunk, and rankings do not depend on approximate-search settings.
    """

    def __init__(self, index: Any, texts: Sequence[str], owners: Sequence[int]) -> None:
        """Wrap a FAISS index whose i-th vector embeds ``texts[i]``, a chunk of ``owners[i]``.

        Args:
            index: A FAISS index holding one vector per text, or ``None`` when there are none.
            texts: The embedded chunk texts.
            owners: For each chunk, the position of its entry in the index's entry list.

        Raises:
            ValueError: The three do not have the same length.
        """
        count = 0 if index is None else int(index.ntotal)
        if not len(texts) == len(owners) == count:
            msg = f"{count} vectors for {len(texts)} texts and {len(owners)} owners"
            raise ValueError(msg)
        self.index = index
        self.texts = list(texts)
        self.owners = [int(o) for o in owners]
        self._owner_array = np.asarray(self.owners, dtype=np.int64)

    @classmethod
    def from_vectors(
        cls, vectors: Sequence[Sequence[float]], texts: Sequence[str], owners: Sequence[int]
    ) -> VectorStore:
        """Index embedded chunks.

        Args:
            vectors: One vector per text, as returned by ``embed_documents``.
            texts: The chunk texts.
            owners: Each chunk's entry position.

        Returns:
            The store; its index is ``None`` when there are no chunks.
        """
        if not len(vectors):
            return cls(None, texts, owners)
        matrix = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        index = faiss.IndexFlatIP(matrix.shape[1])
        index.add(matrix)
        return cls(index, texts, owners)

    def entry_scores(self, vector: Sequence[float], n_entries: int) -> np.ndarray:
        """Each entry's best chunk similarity to the query vector.

        Args:
            vector: The query's embedding.
            n_entries: How many entries the owners index into.

        Returns:
            One score per entry; ``-inf`` for an entry with no chunk.
        """
        scores = np.full(n_entries, -np.inf)
        if self.index is None:
            return scores
        query = np.asarray([vector], dtype=np.float32)
        similarities, ids = self.index.search(query, int(self.index.ntotal))
        found = ids[0] >= 0
        np.maximum.at(
            scores, self._owner_array[ids[0][found]], similarities[0][found].astype(np.float64)
        )
        return scores

    @classmethod
    def load(
        cls, path: Path, manifest: dict[str, Any], texts: Sequence[str], owners: Sequence[int]
    ) -> VectorStore | None:
        """Read a folder written by :meth:`save`, if it holds exactly what is expected.

        Args:
            path: The folder.
            manifest: Fields the folder's manifest must carry with these values.
            texts: The chunk texts the stored vectors must embed, in order.
            owners: Each chunk's entry position, which must match too.

        Returns:
            The store, or ``None`` when the folder is missing, incomplete, altered, in another
            format, or for other chunks.
        """
        expected = {"format": INDEX_FORMAT, **manifest}
        try:
            found = json.loads((path / _MANIFEST_FILE).read_text(encoding="utf-8"))
            if any(found.get(k) != v for k, v in expected.items()):
                return None
            digests = found.get("sha256", {})
            if any(_file_sha256(path / name) != digests.get(name) for name in _DATA_FILES):
                return None
            chunks = json.loads((path / _CHUNKS_FILE).read_text(encoding="utf-8"))
            if chunks.get("texts") != list(texts) or chunks.get("owners") != list(owners):
                return None
            index = faiss.read_index(str(path / _INDEX_FILE))
            return cls(index, texts, owners)
        except (OSError, ValueError, AttributeError, RuntimeError):
            return None

    def save(self, path: Path, manifest: dict[str, Any]) -> bool:
        """Write the store to ``path`` whole, replacing what was there.

        The files are written to a temporary sibling folder that is renamed into place, so a
        reader never sees half a store. An empty store is not written.

        Args:
            path: The folder.
            manifest: Extra fields for the manifest (what the store was built from).

        Returns:
            Whether the folder was written; a read-only or racing cache only costs a rebuild
            next time, so failures are not errors.
        """
        if self.index is None:
            return False
        tmp: Path | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
            faiss.write_index(self.index, str(tmp / _INDEX_FILE))
            chunks = {"texts": self.texts, "owners": self.owners}
            (tmp / _CHUNKS_FILE).write_text(json.dumps(chunks), encoding="utf-8")
            full = {"format": INDEX_FORMAT, **manifest}
            full["sha256"] = {name: _file_sha256(tmp / name) for name in _DATA_FILES}
            (tmp / _MANIFEST_FILE).write_text(json.dumps(full, indent=2), encoding="utf-8")
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        except (OSError, RuntimeError):
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            return False
        return True
