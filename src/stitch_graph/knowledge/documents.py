"""User documents: a team's own notes, tuning guides or papers added to the knowledge index.

Files are converted to text (Markdown and plain text as they are, HTML through the standard
library's parser, PDF through ``pypdf`` when it is installed), cut into chunks of roughly 200-400
words along headings and paragraphs, de-duplicated by a hash of their normalised content and
appended to a JSONL store under the cache dir. The index picks the store up on its next load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

from pydantic import BaseModel, Field

from stitch_graph.knowledge.corpus import KnowledgeEntry, documents_store_path, load_user_entries
from stitch_graph.knowledge.index import reset_default_index

__all__ = [
    "SUPPORTED_SUFFIXES",
    "AddReport",
    "add_documents",
    "chunk_text",
    "content_hash",
    "read_document",
]

SUPPORTED_SUFFIXES = (".md", ".markdown", ".txt", ".text", ".rst", ".html", ".htm", ".pdf")
_TARGET_WORDS = 300
_MAX_WORDS = 400
_MIN_WORDS = 200
_OVERLAP_WORDS = 40
_HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")


class AddReport(BaseModel):
    """What ``add_documents`` did."""

    added_chunks: int = 0
    duplicate_chunks: int = 0
    files: list[str] = Field(default_factory=list, description="Files that contributed chunks.")
    skipped: dict[str, str] = Field(default_factory=dict, description="File → why it was skipped.")
    store: str = ""

    def summary(self) -> str:
        """One line for people."""
        text = (
            f"added {self.added_chunks} chunk(s) from {len(self.files)} file(s), "
            f"{self.duplicate_chunks} duplicate(s) skipped"
        )
        if self.skipped:
            text += f", {len(self.skipped)} file(s) skipped"
        return text


class _TextExtractor(HTMLParser):
    """HTML → Markdown-ish text: headings become ``#`` lines, blocks become paragraphs."""

    _BLOCKS = {"p", "div", "section", "article", "li", "tr", "br", "pre", "table", "ul", "ol"}
    _SKIP = {"script", "style", "head", "nav", "noscript", "svg"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in self._SKIP:
            self._skip_depth += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in self._BLOCKS:
            self.parts.append("\n\n" if tag != "li" else "\n- ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in self._SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif re.fullmatch(r"h[1-6]", tag) or tag in self._BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._skip_depth == 0:
            self.parts.append(re.sub(r"[ \t\r\n]+", " ", data))

    def text(self) -> str:
        raw = "".join(self.parts)
        lines = [line.strip() for line in raw.splitlines()]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def read_document(path: Path) -> str:
    """The text of a document.

    Args:
        path: A Markdown, text, HTML or PDF file.

    Returns:
        Its text; HTML headings come back as ``#`` lines so chunking can follow them.

    Raises:
        ValueError: Unsupported suffix, or a PDF while ``pypdf`` is not installed.
    """
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        msg = f"unsupported document type {suffix or '(none)'}; use one of {SUPPORTED_SUFFIXES}"
        raise ValueError(msg)
    if suffix == ".pdf":
        if importlib.util.find_spec("pypdf") is None:
            msg = "PDF support needs the pypdf package (pip install pypdf); file not added"
            raise ValueError(msg)
        from pypdf import PdfReader

        reader = PdfReader(str(path))
        return "\n\n".join((page.extract_text() or "") for page in reader.pages)
    text = path.read_text(encoding="utf-8", errors="replace")
    if suffix in (".html", ".htm"):
        parser = _TextExtractor()
        parser.feed(text)
        parser.close()
        return parser.text()
    return text


def content_hash(text: str) -> str:
    """Hash of text after lower-casing and collapsing whitespace and punctuation."""
    normal = re.sub(r"[\W_]+", " ", text.lower()).strip()
    return hashlib.sha256(normal.encode()).hexdigest()


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """Split text into (heading, paragraphs) pairs."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for block in re.split(r"\n\s*\n", text):
        block = block.strip()
        if not block:
            continue
        first, _, rest = block.partition("\n")
        match = _HEADING.match(first)
        if match:
            sections.append((match.group(2), []))
            block = rest.strip()
            if not block:
                continue
        sections[-1][1].append(block)
    return [(h, paras) for h, paras in sections if paras]


def chunk_text(text: str) -> list[tuple[str, str]]:
    """Cut text into chunks of about 200-400 words along headings and paragraphs.

    Short sections are merged with the following ones; long ones are cut at paragraph breaks
    (or, for a huge paragraph, at word boundaries), and each continuation starts with the last
    ~40 words of the previous chunk so that no idea is cut in half.

    Args:
        text: Document text; Markdown ``#`` headings mark sections.

    Returns:
        ``(heading, chunk text)`` pairs; the heading is the first section heading in the chunk.
    """
    chunks: list[tuple[str, str]] = []
    heading, words = "", []

    def flush(carry: bool) -> None:
        nonlocal words
        if words:
            chunks.append((heading, " ".join(words)))
            words = words[-_OVERLAP_WORDS:] if carry else []

    for section_heading, paragraphs in _sections(text):
        if len(words) >= _MIN_WORDS:
            flush(carry=False)
        if not words:
            heading = section_heading
        if section_heading and words:
            words.append(f"{section_heading}:")
        for para in paragraphs:
            para_words = para.split()
            while para_words:
                room = _MAX_WORDS - len(words)
                if len(para_words) <= room:
                    words.extend(para_words)
                    para_words = []
                elif len(words) >= _MIN_WORDS:
                    flush(carry=True)
                else:
                    take = max(_TARGET_WORDS - len(words), 1)
                    words.extend(para_words[:take])
                    para_words = para_words[take:]
                    flush(carry=True)
            if len(words) >= _TARGET_WORDS:
                flush(carry=True)
    if words and (not chunks or len(words) > _OVERLAP_WORDS):
        flush(carry=False)
    return chunks


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            out.extend(
                p for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix.lower() in SUPPORTED_SUFFIXES
            )
        else:
            out.append(path)
    return out


def add_documents(paths: Iterable[str | Path], store: Path | None = None) -> AddReport:
    """Add documents to the knowledge store so that the index includes them from its next load.

    Args:
        paths: Files or folders (searched recursively for supported files): Markdown, plain
            text, HTML, and PDF when ``pypdf`` is installed.
        store: The JSONL store; defaults to ``$STITCH_CACHE_DIR/knowledge/documents.jsonl``.

    Returns:
        Counts of added and duplicate chunks and the files skipped with the reason.
    """
    store = store if store is not None else documents_store_path()
    known = {content_hash(e.body) for e in load_user_entries(store)}
    report = AddReport(store=str(store))
    new: list[KnowledgeEntry] = []
    for path in _expand(paths):
        if not path.is_file():
            report.skipped[str(path)] = "not found"
            continue
        try:
            text = read_document(path)
        except (ValueError, OSError) as exc:
            report.skipped[str(path)] = str(exc)
            continue
        contributed = False
        for number, (heading, body) in enumerate(chunk_text(text), start=1):
            digest = content_hash(body)
            if digest in known:
                report.duplicate_chunks += 1
                continue
            known.add(digest)
            title = f"{path.stem}: {heading}" if heading else f"{path.stem} (part {number})"
            new.append(
                KnowledgeEntry(
                    id=f"doc:{digest[:12]}",
                    title=title,
                    body=body,
                    sources=[path.name],
                    path=str(path),
                    origin="user",
                )
            )
            contributed = True
        if contributed:
            report.files.append(str(path))
        elif str(path) not in report.skipped and not chunk_text(text):
            report.skipped[str(path)] = "no text found"
    if new:
        store.parent.mkdir(parents=True, exist_ok=True)
        with store.open("a", encoding="utf-8") as fh:
            for entry in new:
                fh.write(entry.model_dump_json() + "\n")
        reset_default_index()
    report.added_chunks = len(new)
    return report
