"""ncu command building, CSV parsing (real H200 captures and synthetic cases) and classification."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from stitch_graph.artifacts import KernelMetrics
from stitch_graph.toolchain.ncu import (
    classify_bottleneck,
    ncu_command,
    ncu_profile,
    parse_ncu_csv,
    parse_ncu_rules,
    summarize_profile,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ncu"
SOL = (FIXTURES / "axpy_speed_of_light.csv").read_text()
FULL = (FIXTURES / "axpy_full_set.csv").read_text()

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
    '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value",'
    '"Rule Name","Rule Type","Rule Description","Estimated Speedup Type","Estimated Speedup"'
)
SOL_SECTION = "GPU Speed Of Light Throughput"


def _row(
    launch: int,
    kernel: str,
    section: str,
    name: str,
    unit: str,
    value: str,
    block: str = "(256, 1, 1)",
    grid: str = "(1024, 1, 1)",
) -> str:
    cells = [
        str(launch),
        "4242",
        "python3.12",
        "127.0.0.1",
        kernel,
        "1",
        "7",
        block,
        grid,
        "0",
        "9.0",
        section,
        name,
        unit,
        value,
    ]
    return ",".join(f'"{c}"' for c in cells) + ","


def _launch(
    launch: int,
    kernel: str,
    *,
    duration: str,
    unit: str = "ns",
    dram: str,
    sm: str,
    memory: str | None = None,
    grid: str = "(1024, 1, 1)",
    occupancy: str = "80",
) -> list[str]:
    rows = [
        ("Memory Throughput", "%", memory or dram),
        ("DRAM Throughput", "%", dram),
        ("Duration", unit, duration),
        ("Compute (SM) Throughput", "%", sm),
    ]
    out = [_row(launch, kernel, SOL_SECTION, n, u, v, grid=grid) for n, u, v in rows]
    out.append(_row(launch, kernel, "Occupancy", "Achieved Occupancy", "%", occupancy, grid=grid))
    return out


def _csv(*launches: list[str], preamble: str = "") -> str:
    body = [line for launch in launches for line in launch]
    return preamble + "\n".join([HEADER, *body]) + "\n"


# --------------------------------------------------------------------------------------------
# Real captures


def test_speed_of_light_fixture_values() -> None:
    [k] = parse_ncu_csv(SOL)
    assert k.name == "axpy"
    assert k.duration_us == pytest.approx(57.568)
    assert k.dram_pct == pytest.approx(66.23)
    assert k.memory_pct == pytest.approx(66.23)
    assert k.sm_pct == pytest.approx(35.05)
    assert (k.block_size, k.grid_size) == (256, 65536)
    assert k.bottleneck == "memory"
    assert k.metrics["GPU Speed Of Light Throughput/Elapsed Cycles"] == 113820
    assert k.metrics["GPU Speed Of Light Throughput/DRAM Frequency"] == pytest.approx(
        3_199_184_732.26
    )
    assert k.metrics["GPU Speed Of Light Throughput/Duration"] == pytest.approx(57.568)
    assert not any(key.startswith("SpeedOfLight/") for key in k.metrics)  # rule row skipped


def test_full_set_fixture_values() -> None:
    [k] = parse_ncu_csv(FULL)
    assert k.duration_us == pytest.approx(57.76)
    assert k.achieved_occupancy_pct == pytest.approx(74.45)
    assert k.theoretical_occupancy_pct == pytest.approx(100.0)
    assert k.registers_per_thread == 16
    # "Memory Throughput" is also a byte/s metric in another section: the % one is memory_pct
    assert k.memory_pct == pytest.approx(66.06)
    assert k.metrics["Memory Workload Analysis/Memory Throughput"] == pytest.approx(
        3_177_245_429_362.88
    )
    assert k.metrics["Launch Statistics/Threads"] == 16_777_216
    assert "Launch Statistics/Cluster Scheduling Policy" not in k.metrics  # not numeric
    assert len(k.metrics) > 60


def test_fixture_rules() -> None:
    rules = parse_ncu_rules(FULL)
    names = [r[1] for r in rules]
    assert names[0] == "SOLBottleneck"
    assert {"HighPipeUtilization", "AchievedOccupancy", "CPIStall"} <= set(names)
    kernel, _, description, speedup = rules[0]
    assert kernel == "axpy"
    assert description.startswith("Memory is more heavily utilized than Compute")
    assert speedup is None
    pipe = next(r for r in rules if r[1] == "HighPipeUtilization")
    assert pipe[3] == pytest.approx(94.82)
    assert [r[1] for r in parse_ncu_rules(SOL)] == ["SOLBottleneck"]


def test_fixture_summary() -> None:
    report = summarize_profile(parse_ncu_csv(SOL), rules=parse_ncu_rules(SOL))
    assert report.status == "passed"
    assert report.source == "ncu"
    assert report.bottleneck == "memory"
    assert report.headroom == pytest.approx(1 - 0.6623, abs=1e-4)
    assert "axpy" in report.reason and "memory-bound" in report.reason


# --------------------------------------------------------------------------------------------
# Synthetic CSVs


def test_multiple_kernels_and_launches() -> None:
    text = _csv(
        _launch(0, "add_relu", duration="10,000", dram="80", sm="20"),
        _launch(1, "softmax", duration="30", unit="us", dram="30", sm="85"),
        _launch(2, "add_relu", duration="12,500", dram="81", sm="21"),
        _launch(3, "add_relu", duration="0.0125", unit="ms", dram="79", sm="20"),
    )
    kernels = parse_ncu_csv(text)
    assert [k.name for k in kernels] == ["add_relu", "softmax", "add_relu", "add_relu"]
    assert [k.duration_us for k in kernels] == pytest.approx([10.0, 30.0, 12.5, 12.5])
    assert [k.bottleneck for k in kernels] == ["memory", "compute", "memory", "memory"]

    report = summarize_profile(kernels)
    # add_relu: 35 us in three launches beats softmax's single 30 us launch
    assert report.bottleneck == "memory"
    assert report.reason.startswith("add_relu dominates (35.0 us")
    expected = (10 * 0.2 + 30 * 0.15 + 12.5 * 0.19 + 12.5 * 0.21) / 65
    assert report.headroom == pytest.approx(expected, abs=1e-4)


def test_preamble_and_program_output_are_ignored() -> None:
    preamble = (
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
        "reference ok, max error 0.0\n"
        "==WARNING== Note: Running with unmodified GPU clocks.\n"
    )
    launch = _launch(0, "k", duration="57,568", dram="66.23", sm="35.05")
    launch.insert(2, "step 3 done, loss=0.5")
    launch.insert(3, "==PROF== Disconnected from process 4242")
    [k] = parse_ncu_csv(_csv(launch, preamble=preamble))
    assert k.duration_us == pytest.approx(57.568)
    assert k.sm_pct == pytest.approx(35.05)
    assert parse_ncu_csv("==PROF== No kernels were profiled.\n") == []
    assert parse_ncu_csv("") == []


@pytest.mark.parametrize(
    ("dram", "sm", "duration_us", "grid", "expected"),
    [
        (85.0, 30.0, 100.0, 4096, "memory"),
        (30.0, 85.0, 100.0, 4096, "compute"),
        (70.0, 68.0, 100.0, 4096, "memory"),  # both high: the higher one
        (20.0, 15.0, 100.0, 4096, "latency"),  # nothing busy
        (55.0, 20.0, 100.0, 4096, "memory"),  # leans clearly to memory
        (50.0, 45.0, 100.0, 4096, "latency"),  # middling and balanced
        (10.0, 5.0, 2.0, 8, "launch"),  # tiny grid, a few microseconds
        (10.0, 5.0, 2.0, 100_000, "latency"),  # short but a big grid is not launch-bound
    ],
)
def test_classify_bottleneck(
    dram: float, sm: float, duration_us: float, grid: int, expected: str
) -> None:
    m = KernelMetrics(
        name="k", dram_pct=dram, memory_pct=dram, sm_pct=sm, duration_us=duration_us, grid_size=grid
    )
    assert classify_bottleneck(m) == expected


def test_classify_uses_memory_pct_when_l2_is_the_limit() -> None:
    m = KernelMetrics(name="k", dram_pct=20.0, memory_pct=90.0, sm_pct=30.0, duration_us=50.0)
    assert classify_bottleneck(m) == "memory"


def test_classify_without_throughput_is_unknown() -> None:
    assert classify_bottleneck(KernelMetrics(name="k", duration_us=50.0)) == "unknown"


def test_summary_of_nothing_is_an_error() -> None:
    report = summarize_profile([])
    assert report.status == "error" and "no kernels" in report.reason


def test_summary_headroom_is_clipped_and_rules_quoted() -> None:
    k = KernelMetrics(name="k", duration_us=40.0, dram_pct=120.0, sm_pct=10.0)
    rules = [("k", "Uncoalesced", "bad access", 42.0), ("other", "X", "y", 99.0)]
    report = summarize_profile([k], rules=rules)
    assert report.headroom == 0.0
    assert "Uncoalesced 42%" in report.reason and "X 99%" not in report.reason


# --------------------------------------------------------------------------------------------
# The command and running it


def test_ncu_command_default_sections() -> None:
    cmd = ncu_command(
        ["python", "bench.py", "--n", "4"],
        kernel_filter="axpy",
        launch_skip=3,
        launch_count=2,
        ncu="ncu",
    )
    assert cmd[:6] == ["ncu", "--csv", "--page", "details", "--clock-control", "none"]
    assert cmd.count("--section") == 3
    for section in ("SpeedOfLight", "Occupancy", "LaunchStats"):
        assert cmd[cmd.index(section) - 1] == "--section"
    assert cmd[cmd.index("-k") + 1] == "regex:axpy"
    assert cmd[cmd.index("--launch-skip") + 1] == "3"
    assert cmd[cmd.index("--launch-count") + 1] == "2"
    assert cmd[-4:] == ["python", "bench.py", "--n", "4"]


def test_ncu_command_full_set_and_options() -> None:
    cmd = ncu_command(
        ["./a.out"],
        set_full=True,
        launch_count=None,
        clock_control="base",
        kernel_filter="exact:axpy",
        extra=["--cache-control", "all"],
        ncu="ncu",
    )
    assert cmd[cmd.index("--set") + 1] == "full"
    assert "--section" not in cmd
    assert "--launch-count" not in cmd
    assert cmd[cmd.index("--clock-control") + 1] == "base"
    assert cmd[cmd.index("-k") + 1] == "exact:axpy"
    assert cmd[-3:] == ["--cache-control", "all", "./a.out"]
    with pytest.raises(ValueError, match="program"):
        ncu_command([], ncu="ncu")
    with pytest.raises(ValueError, match="launch_count"):
        ncu_command(["./a.out"], launch_count=0, ncu="ncu")


FAKE_NCU = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_NCU_ARGS"
sleep "${FAKE_NCU_SLEEP:-0}"
cat "$FAKE_NCU_OUT"
echo "${FAKE_NCU_STDERR:-}" >&2
exit "${FAKE_NCU_RC:-0}"
"""


@pytest.fixture
def fake_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A stand-in ncu that prints a given output; returns a function running ncu_profile."""
    script = tmp_path / "ncu"
    script.write_text(FAKE_NCU)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("STITCH_NCU", str(script))

    def run(
        output: str, rc: int = 0, timeout_s: float = 30.0, sleep: float = 0.0, stderr: str = ""
    ):
        out = tmp_path / "out.txt"
        out.write_text(output)
        env = {
            "FAKE_NCU_OUT": str(out),
            "FAKE_NCU_ARGS": str(tmp_path / "args.txt"),
            "FAKE_NCU_RC": str(rc),
            "FAKE_NCU_SLEEP": str(sleep),
            "FAKE_NCU_STDERR": stderr,
        }
        report = ncu_profile(
            ["python", "bench.py"], kernel_filter="axpy", env=env, cwd=tmp_path, timeout_s=timeout_s
        )
        args_file = tmp_path / "args.txt"
        args = args_file.read_text().splitlines() if args_file.exists() else []
        return report, args

    return run


def test_profile_success(fake_ncu) -> None:
    report, args = fake_ncu(SOL)
    assert report.status == "passed"
    assert report.bottleneck == "memory"
    assert [k.name for k in report.kernels] == ["axpy"]
    assert report.kernels[0].duration_us == pytest.approx(57.568)
    assert args[:2] == ["--csv", "--page"] and args[-2:] == ["python", "bench.py"]
    assert "regex:axpy" in args


def test_profile_counter_permission(fake_ncu) -> None:
    report, _ = fake_ncu(
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0.\n",
        rc=1,
    )
    assert report.status == "not_run"
    assert "ERR_NVGPUCTRPERM" in report.reason and "NVreg_RestrictProfilingToAdminUsers" in (
        report.reason
    )


def test_profile_no_kernels(fake_ncu) -> None:
    report, _ = fake_ncu("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n")
    assert report.status == "error"
    assert "No kernels were profiled" in report.reason and "kernel_filter" in report.reason
    assert report.kernels == []


def test_profile_program_failure_keeps_what_was_measured(fake_ncu) -> None:
    report, _ = fake_ncu(SOL + "==ERROR== The application returned an error code (1).\n", rc=1)
    assert report.status == "error"
    assert "status 1" in report.reason and "application returned an error" in report.reason
    assert report.kernels and report.bottleneck == "memory"


def test_profile_crash_without_output(fake_ncu) -> None:
    report, _ = fake_ncu("", rc=139, stderr="Segmentation fault (core dumped)")
    assert report.status == "error"
    assert "139" in report.reason and "Segmentation fault" in report.reason


def test_profile_timeout(fake_ncu) -> None:
    start = time.perf_counter()
    report, _ = fake_ncu(SOL, sleep=20, timeout_s=0.5)
    assert time.perf_counter() - start < 10
    assert report.status == "error" and "timed out" in report.reason


def test_profile_without_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STITCH_NCU", str(tmp_path / "no-such-ncu"))
    monkeypatch.setenv("PATH", str(tmp_path))
    report = ncu_profile(["python", "bench.py"])
    assert report.status == "not_run"
    assert "ncu not found" in report.reason and "STITCH_NCU" in report.reason
    assert "Nsight Compute" in report.reason
