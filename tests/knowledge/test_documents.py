"""User documents: added, de-duplicated, persisted, and searchable after a reload."""

from __future__ import annotations

import pytest

from stitch_graph.knowledge.corpus import documents_store_path
from stitch_graph.knowledge.documents import add_documents, chunk_text, read_document
from stitch_graph.knowledge.embeddings import HashingEmbeddings
from stitch_graph.knowledge.index import KnowledgeIndex

MARKDOWN = """# Team notes on the zebra transpose

## Zebra striping

Our zebra transpose kernel stores tiles in a striped layout so that the quokka gather step reads
each stripe with one instruction. Keep the stripe width at 48 elements.
"""

HTML = """<html><head><title>Quokka guide</title><style>p {color: red}</style></head>
<body><h1>Quokka gather</h1><p>The quokka gather reorders rows by a permutation array before
the zebra transpose; run it on its own stream.</p><script>var x = 1;</script></body></html>"""


@pytest.fixture
def cache(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("STITCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_add_markdown_and_html_then_search(cache) -> None:
    md = cache / "notes.md"
    md.write_text(MARKDOWN)
    html = cache / "guide.html"
    html.write_text(HTML)
    report = add_documents([md, html])
    assert report.added_chunks == 2 and len(report.files) == 2 and not report.skipped
    assert documents_store_path().is_file()

    again = add_documents([md, html])
    assert again.added_chunks == 0 and again.duplicate_chunks == 2

    index = KnowledgeIndex(embedder=HashingEmbeddings()).load()
    assert sum(e.origin == "user" for e in index.entries) == 2
    hits = index.search("zebra transpose stripe width", k=3)
    assert hits[0].id.startswith("doc:") and hits[0].source.endswith("notes.md")
    hits = index.search("quokka gather permutation", k=3, mode="keyword")
    assert hits[0].source.endswith("guide.html")


def test_html_text_strips_tags_scripts_and_styles(cache) -> None:
    path = cache / "g.html"
    path.write_text(HTML)
    text = read_document(path)
    assert "# Quokka gather" in text and "permutation" in text
    assert "<p>" not in text and "var x" not in text and "color: red" not in text


def test_unsupported_and_pdf_messages(cache) -> None:
    odd = cache / "data.bin"
    odd.write_bytes(b"\0\1")
    report = add_documents([odd, cache / "missing.md"])
    assert report.added_chunks == 0
    assert "unsupported" in report.skipped[str(odd)]
    assert report.skipped[str(cache / "missing.md")] == "not found"


def test_chunks_are_bounded_and_overlap() -> None:
    paragraphs = [" ".join(f"w{p}_{i}" for i in range(90)) for p in range(12)]
    chunks = chunk_text("# Big\n\n" + "\n\n".join(paragraphs))
    assert len(chunks) >= 3
    assert all(len(body.split()) <= 400 for _, body in chunks)
    assert all(len(body.split()) >= 150 for _, body in chunks[:-1])
    first, second = chunks[0][1].split(), chunks[1][1].split()
    assert first[-1] in second[:50]
