"""The op-coverage probe: one row per call that is not generated whole, and the counts."""

from __future__ import annotations

from tests.tool_scripts import load_tool


def test_rows_say_generated_declared_or_not_captured(tmp_path, capsys):
    probe = load_tool("probe_op_coverage")
    calls = tmp_path / "calls.txt"
    calls.write_text(
        "# one of each\n"
        "torch.relu(x) * y\n"
        "torch.fft.rfft(x, dim=-1).abs()\n"
        "torch.nonzero(x > 0).float().sum().reshape(1)\n"
    )
    assert probe.main([str(calls)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("DECL | torch.fft.rfft(x, dim=-1).abs() | fft_rfft")
    assert out[1].startswith("ERR  | torch.nonzero")
    assert out[-1] == (
        "1 of 3 generated whole; 1 leave ops to PyTorch (declared); 1 did not capture"
    )
