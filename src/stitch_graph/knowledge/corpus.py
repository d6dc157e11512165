"""Loading the knowledge corpus: where it lives, how an entry is parsed, what it fingerprints to.

The corpus is a folder of Markdown files, one entry each, with a small front-matter block. It is
kept as plain text so that people can review and extend it like code, and it ships inside the
package (``stitch_graph/knowledge/entries/``) so that an installed wheel has it. User documents
added with :mod:`stitch_graph.knowledge.documents` are stored as JSONL under the cache dir and
loaded here too, so that both kinds of entry reach the index through one path.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "BOTTLENECK_TAGS",
    "KnowledgeEntry",
    "cache_root",
    "corpus_fingerprint",
    "documents_store_path",
    "knowledge_dir",
    "load_corpus",
    "load_user_entries",
    "parse_entry",
]

BOTTLENECK_TAGS: frozenset[str] = frozenset({"memory", "compute", "latency", "launch", "compile"})
"""Tags an entry may carry in ``bottlenecks``."""

_ENTRIES_DIR = "entries"
_LIST_FIELDS = ("bottlenecks", "metrics", "keywords", "sources")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*\n", re.DOTALL)


class KnowledgeEntry(BaseModel):
    """One piece of advice: a corpus entry or a chunk of a user document."""

    id: str
    title: str
    action: str = Field(default="", description="Short verb phrase, e.g. 'vectorise loads'.")
    bottlenecks: list[str] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    body: str = ""
    path: str = Field(default="", description="Source file, relative to the corpus dir if inside.")
    origin: Literal["corpus", "user"] = "corpus"

    @property
    def short_action(self) -> str:
        """The action, or one derived from the title when the entry has none."""
        if self.action:
            return self.action
        title = re.sub(r"\s*\(.*?\)\s*", " ", self.title).strip()
        return f"apply: {title[:60]}"

    @property
    def word_count(self) -> int:
        """Words in the body."""
        return len(self.body.split())


def knowledge_dir() -> Path:
    """The corpus directory.

    Returns:
        ``$STITCH_KNOWLEDGE_DIR`` if set, else the ``entries/`` folder shipped as package data
        next to this module, so that the corpus is found the same way from a source checkout
        and from an installed wheel.
    """
    env = os.environ.get("STITCH_KNOWLEDGE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent / _ENTRIES_DIR


def cache_root() -> Path:
    """Where the knowledge index and user documents are cached.

    Returns:
        ``$STITCH_CACHE_DIR/knowledge`` if the variable is set, else
        ``~/.cache/stitch-graph/knowledge``.
    """
    env = os.environ.get("STITCH_CACHE_DIR")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "stitch-graph"
    return base / "knowledge"


def documents_store_path() -> Path:
    """The JSONL file holding chunks of user documents (one :class:`KnowledgeEntry` a line)."""
    return cache_root() / "documents.jsonl"


def _parse_value(raw: str) -> str | list[str]:
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):
        inner = raw[1:-1].strip()
        if not inner:
            return []
        items = next(csv.reader([inner], skipinitialspace=True))
        return [item.strip() for item in items if item.strip()]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return str(json.loads(raw))
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    return raw


def parse_entry(text: str, path: Path | str = "") -> KnowledgeEntry:
    """Parse one Markdown entry with a front-matter block.

    Args:
        text: The file's text: ``---``, ``key: value`` lines (lists as ``[a, "b, c"]``), ``---``,
            then the Markdown body.
        path: Where it came from, for messages and hits.

    Returns:
        The parsed entry.

    Raises:
        ValueError: No front matter, a missing ``id``/``title``, or an unknown bottleneck tag.
    """
    match = _FRONT_MATTER.match(text)
    if not match:
        msg = f"{path}: no front-matter block (--- ... ---) at the top"
        raise ValueError(msg)
    meta: dict[str, str | list[str]] = {}
    for line in match.group(1).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            msg = f"{path}: front-matter line without ':': {line!r}"
            raise ValueError(msg)
        meta[key.strip()] = _parse_value(value)
    for key in ("id", "title"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            msg = f"{path}: front matter needs a non-empty {key!r}"
            raise ValueError(msg)
    for key in _LIST_FIELDS:
        value = meta.get(key, [])
        meta[key] = [value] if isinstance(value, str) else value
    unknown = set(meta["bottlenecks"]) - BOTTLENECK_TAGS
    if unknown:
        allowed = sorted(BOTTLENECK_TAGS)
        msg = f"{path}: unknown bottleneck tags {sorted(unknown)}; allowed {allowed}"
        raise ValueError(msg)
    action = meta.get("action", "")
    return KnowledgeEntry(
        id=str(meta["id"]),
        title=str(meta["title"]),
        action=action if isinstance(action, str) else ", ".join(action),
        bottlenecks=list(meta["bottlenecks"]),
        metrics=list(meta["metrics"]),
        keywords=list(meta["keywords"]),
        sources=list(meta["sources"]),
        body=text[match.end() :].strip(),
        path=str(path),
    )


def load_corpus(directory: Path | str | None = None) -> list[KnowledgeEntry]:
    """Parse every ``*.md`` entry directly inside the corpus directory.

    Args:
        directory: The corpus dir; defaults to :func:`knowledge_dir`. Sub-folders and files
            starting with ``_`` or named ``README.md`` are not entries.

    Returns:
        Entries sorted by id.

    Raises:
        FileNotFoundError: The directory does not exist.
        ValueError: An entry does not parse, or two entries share an id.
    """
    root = Path(directory) if directory is not None else knowledge_dir()
    if not root.is_dir():
        msg = f"knowledge corpus directory not found: {root} (set STITCH_KNOWLEDGE_DIR)"
        raise FileNotFoundError(msg)
    entries: dict[str, KnowledgeEntry] = {}
    for file in sorted(root.glob("*.md")):
        if file.name.startswith("_") or file.name.lower() == "readme.md":
            continue
        entry = parse_entry(file.read_text(encoding="utf-8"), file.name)
        if entry.id in entries:
            msg = f"duplicate knowledge id {entry.id!r} in {file.name} and {entries[entry.id].path}"
            raise ValueError(msg)
        entries[entry.id] = entry
    return [entries[key] for key in sorted(entries)]


def load_user_entries(store: Path | None = None) -> list[KnowledgeEntry]:
    """Read the chunks of user documents saved by ``add_documents``.

    Args:
        store: The JSONL file; defaults to :func:`documents_store_path`.

    Returns:
        The stored entries in insertion order; empty when nothing was added.
    """
    path = store if store is not None else documents_store_path()
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entries.append(KnowledgeEntry.model_validate_json(line))
    return entries


def corpus_fingerprint(entries: Iterable[KnowledgeEntry]) -> str:
    """A content hash of the entries; it changes whenever any entry changes."""
    h = hashlib.sha256()
    for entry in entries:
        h.update(entry.model_dump_json(exclude={"path"}).encode())
        h.update(b"\0")
    return h.hexdigest()
