"""The suite benchmark's bookkeeping: kept rows and geometric means."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "bench_suite.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_are_kept_only_from_the_same_machine(tmp_path):
    bench = load()
    out = tmp_path / "suite.json"
    rows = [{"problem": "a.py", "outcome": "verified"}, {"problem": "b.py", "outcome": "error"}]
    out.write_text(json.dumps({"machine": "H200; torch 2.11", "rows": rows}))
    assert [r["problem"] for r in bench.kept_rows(out, "H200; torch 2.11")] == ["a.py"]
    assert bench.kept_rows(out, "A100; torch 2.11") == []
    assert bench.kept_rows(tmp_path / "missing.json", "H200; torch 2.11") == []


def test_geomean_ignores_missing_values():
    bench = load()
    assert math.isclose(bench.geomean([2.0, 8.0, None]), 4.0)
    assert bench.geomean([None]) is None
