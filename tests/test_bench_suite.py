"""The suite benchmark's bookkeeping: kept rows and geometric means."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.tool_scripts import load_tool


def test_rows_are_kept_only_from_the_same_machine(tmp_path):
    bench = load_tool("bench_suite")
    out = tmp_path / "suite.json"
    rows = [{"problem": "a.py", "outcome": "verified"}, {"problem": "b.py", "outcome": "error"}]
    out.write_text(json.dumps({"machine": "H200; torch 2.11", "rows": rows}))
    assert [r["problem"] for r in bench.kept_rows(out, "H200; torch 2.11")] == ["a.py"]
    assert bench.kept_rows(out, "A100; torch 2.11") == []
    assert bench.kept_rows(tmp_path / "missing.json", "H200; torch 2.11") == []


def test_geomean_ignores_missing_values():
    bench = load_tool("bench_suite")
    assert math.isclose(bench.geomean([2.0, 8.0, None]), 4.0)
    assert bench.geomean([None]) is None


def test_shards_split_the_suite_without_overlap():
    bench = load_tool("bench_suite")
    paths = [Path(f"p{i}.py") for i in range(5)]
    parts = [bench.select_shard(paths, f"{k}/2") for k in range(2)]
    assert parts == [paths[0::2], paths[1::2]]
    assert bench.select_shard(paths, None) == paths
    for bad in ("2/2", "x/2", "1"):
        try:
            bench.select_shard(paths, bad)
        except SystemExit as exc:
            assert "--shard" in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_merged_table_has_named_group_means(tmp_path, capsys):
    bench = load_tool("bench_suite")
    for name, rows in {
        "a.json": [{"problem": "s/norm/x.py", "outcome": "verified", "vs_eager": 2.0,
                    "vs_compile": 1.0}],
        "b.json": [{"problem": "s/softmax/y.py", "outcome": "verified", "vs_eager": 8.0,
                    "vs_compile": 4.0},
                   {"problem": "s/gemm/z.py", "outcome": "verified", "vs_eager": 1.0,
                    "vs_compile": 1.0}],
    }.items():
        (tmp_path / name).write_text(json.dumps({"machine": "H200", "rows": rows}))
    assert bench.main(["ignored", "--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                       "--group", "fusion=norm,softmax"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# H200"
    assert [line.split()[0] for line in lines[2:5]] == ["gemm/z", "norm/x", "softmax/y"]
    fusion = next(line.split() for line in lines if line.startswith("fusion"))
    assert fusion[1:3] == ["2", "2"] and fusion[4:6] == ["4.00", "2.00"]


def test_every_sweep_times_its_references_afresh(tmp_path, monkeypatch):
    bench = load_tool("bench_suite")
    (tmp_path / "norm").mkdir()
    (tmp_path / "norm" / "p.py").write_text("")
    seen = []

    def fake_run(path, ctx):
        seen.append(ctx.work_dir)
        return {"problem": str(path), "outcome": "verified"}

    monkeypatch.setattr(bench, "run_one", fake_run)
    monkeypatch.setattr(bench, "machine", lambda: "test machine")
    for _ in range(2):
        assert bench.main([str(tmp_path)]) == 0
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(Path(folder).is_dir() and not any(Path(folder).iterdir()) for folder in seen)
