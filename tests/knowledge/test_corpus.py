"""The corpus parses, is tagged and sourced, and the labelled queries point at real entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stitch_graph.knowledge.corpus import BOTTLENECK_TAGS, knowledge_dir, load_corpus, parse_entry
from stitch_graph.knowledge.index import tokenize

QUERIES = Path(__file__).resolve().parents[2] / "tools" / "knowledge_eval" / "queries.jsonl"


@pytest.fixture(scope="module")
def entries():
    return load_corpus()


def test_corpus_has_enough_tagged_and_sourced_entries(entries) -> None:
    assert len(entries) >= 40
    for entry in entries:
        assert entry.sources, entry.id
        assert entry.bottlenecks, entry.id
        assert set(entry.bottlenecks) <= BOTTLENECK_TAGS, entry.id
        assert entry.metrics and entry.keywords, entry.id
        assert 120 <= entry.word_count <= 300, (entry.id, entry.word_count)
        body = entry.body.lower()
        assert any(m in body for m in ("when not", "not the", "not this")), entry.id


def test_required_topics_present(entries) -> None:
    ids = {e.id for e in entries}
    for needed in ("coalescing", "vectorized-loads", "bank-conflicts", "cuda-graphs",
                   "online-softmax", "welford", "tf32", "register-pressure-spills",
                   "compile-extern-c", "index-overflow-64bit", "hopper-wgmma", "split-k"):
        assert needed in ids


def test_labelled_queries_reference_existing_entries(entries) -> None:
    ids = {e.id for e in entries}
    rows = [json.loads(line) for line in
            QUERIES.read_text().splitlines() if line.strip()]
    assert len(rows) >= 44
    for row in rows:
        assert 1 <= len(row["expected"]) <= 3
        assert set(row["expected"]) <= ids, row


def test_parse_entry_rejects_bad_front_matter() -> None:
    with pytest.raises(ValueError, match="front-matter"):
        parse_entry("# no front matter\n", "x.md")
    with pytest.raises(ValueError, match="unknown bottleneck"):
        parse_entry("---\nid: a\ntitle: A\nbottlenecks: [speed]\n---\nbody\n", "a.md")


def test_parse_entry_lists_with_quotes() -> None:
    entry = parse_entry(
        '---\nid: a\ntitle: "Say \\"hi\\""\nkeywords: [extern "C", "a, b", c]\n---\n# A\nbody',
        "a.md",
    )
    assert entry.title == 'Say "hi"'
    assert entry.keywords == ['extern "C"', "a, b", "c"]


def test_tokenizer_keeps_cuda_jargon() -> None:
    tokens = tokenize("__syncthreads() then cp.async on sm_90a with ld.global.v4 and "
                      "cudaFuncSetAttribute, max_abs_error; spills coalesced")
    for kept in ("__syncthreads", "cp.async", "sm_90a", "ld.global.v4", "cudafuncsetattribute"):
        assert kept in tokens
    for part in ("async", "global", "func", "attribut", "abs", "spill", "coalesc"):
        assert part in tokens


def test_corpus_ships_inside_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import stitch_graph.knowledge as package

    monkeypatch.delenv("STITCH_KNOWLEDGE_DIR", raising=False)
    root = knowledge_dir()
    assert root.parent == Path(package.__file__).resolve().parent
    assert len(load_corpus(root)) == len(list(root.glob("*.md")))
