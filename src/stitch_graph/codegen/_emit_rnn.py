"""LSTM and GRU layers: cuBLAS GEMMs and one generated gate kernel a time step.

Per layer and direction, one SGEMM projects the inputs of every time step at once
(``G = X W_ih^T``); then each step multiplies the hidden state by ``W_hh^T`` (``Q = h W_hh^T``)
and one kernel applies the gates, with both biases, to update the cell and hidden state in place
and write the step's output. Gate order and formulas are PyTorch's (LSTM: i, f, g, o; GRU: r, z,
n with ``n = tanh(G_n + b_in + r * (Q_n + b_hn))``). The host loop is launch-bound, so the plan
asks for CUDA-graph replay.

``_RnnEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math

from stitch_graph.codegen._emit_base import _EmitterBase, _py
from stitch_graph.codegen.ir import Group, Ref
from stitch_graph.codegen.tuning import KernelTuning

_SIGMOID = "(1.f / (1.f + expf(-({}))))"
_ELEMENTS = "  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < N; e += gridDim.x * blockDim.x) {"


def _lstm_update(bias: bool) -> list[str]:
    """Gate lines of one LSTM element: ``gr``/``qr`` are the step's projections of (b, t)."""
    def gate(k: int) -> str:
        terms = [f"gr[{k} * H + j]", f"qr[{k} * H + j]"]
        if bias:
            terms += [f"bi[{k} * H + j]", f"bh[{k} * H + j]"]
        return " + ".join(terms)

    return [
        f"const float ig = {_SIGMOID.format(gate(0))};",
        f"const float fg = {_SIGMOID.format(gate(1))};",
        f"const float gg = tanhf({gate(2)});",
        f"const float og = {_SIGMOID.format(gate(3))};",
        "const float cn = fg * c[slot + e] + ig * gg;",
        "c[slot + e] = cn;",
        "const float hv = og * tanhf(cn);",
    ]


def _gru_update(bias: bool) -> list[str]:
    """Gate lines of one GRU element (``hp[e]`` is the previous hidden state)."""
    def part(k: int, source: str) -> str:
        own = "bi" if source == "gr" else "bh"
        return f"{source}[{k} * H + j]" + (f" + {own}[{k} * H + j]" if bias else "")

    return [
        f"const float rg = {_SIGMOID.format(part(0, 'gr') + ' + ' + part(0, 'qr'))};",
        f"const float zg = {_SIGMOID.format(part(1, 'gr') + ' + ' + part(1, 'qr'))};",
        f"const float ng = tanhf({part(2, 'gr')} + rg * ({part(2, 'qr')}));",
        "const float hv = (1.f - zg) * ng + zg * hp[e];",
    ]


def _head(block: int, name: str, params: list[str]) -> str:
    """The opening line of a launchable kernel."""
    return f'extern "C" __global__ __launch_bounds__({block}) void {name}({", ".join(params)}) {{'


class _RnnEmitter(_EmitterBase):
    """Host loop and kernels of an ``lstm``/``gru`` node (``rnn``)."""

    def rnn(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        lstm = node.op == "lstm"
        x: Ref = node.args["input"]
        hx = node.args["hx"]
        h0, c0 = (hx[0], hx[1]) if lstm else (hx if isinstance(hx, Ref) else hx[0], None)
        params: list[Ref] = list(node.args["params"])
        bias = bool(node.args.get("has_biases"))
        dirs = 2 if node.args.get("bidirectional") else 1
        layers = int(node.args["num_layers"])
        batch_first = bool(node.args.get("batch_first"))
        xs = ir.shapes[x]
        steps, batch = (xs[1], xs[0]) if batch_first else (xs[0], xs[1])
        gates, hidden = ir.shapes[params[1]]  # weight_hh: (gates * H, H)
        per = 4 if bias else 2
        n = batch * hidden
        block = min(max(tun.block_size, 32), 1024)
        grid = max(1, math.ceil(n / block))
        sb, st = (steps, 1) if batch_first else (1, batch)  # row of (b, t) = b * sb + t * st
        name = node.name
        consts = [
            f"constexpr int H = {hidden}, GH = {gates}, N = {n}, DH = {dirs * hidden};",
            f"constexpr long long SB = {sb}, ST = {st};",
        ]
        c_in, c_out = (["const float* __restrict__ c0"], ["float* __restrict__ c"]) if lstm else ([], [])
        init = [
            _head(block, f"{kernel}_init", ["const float* __restrict__ h0", *c_in,
                                            "float* __restrict__ hp", "float* __restrict__ hn",
                                            *c_out, "int s"]),
            f"  constexpr int N = {n};",
            "  const long long slot = (long long)s * N;",
            _ELEMENTS,
            "    hp[e] = h0[slot + e];",
            "    hn[slot + e] = h0[slot + e];",
            *(["    c[slot + e] = c0[slot + e];"] if lstm else []),
            "  }",
            "}",
        ]
        update = _lstm_update(bias) if lstm else _gru_update(bias)
        step = [
            f"// {node.op} time step: {batch} x {hidden} hidden units, one thread each",
            _head(block, f"{kernel}_step", [
                "const float* __restrict__ gx", "const float* __restrict__ gh",
                *(["const float* __restrict__ bi", "const float* __restrict__ bh"] if bias else []),
                "float* __restrict__ hp", *c_out, "float* __restrict__ hn", "float* __restrict__ y",
                "int t", "int s", "int d",
            ]),
            *(f"  {line}" for line in consts),
            "  const long long slot = (long long)s * N;",
            _ELEMENTS,
            "    const int b = e / H, j = e % H;",
            "    const long long row = b * SB + t * ST;",
            "    const float* gr = gx + row * GH;",
            "    const float* qr = gh + (long long)b * GH;",
            *(f"    {line}" for line in update),
            "    hp[e] = hv;",
            "    hn[slot + e] = hv;",
            "    y[row * DH + d * H + j] = hv;",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(init))
        self.kernels.append("\n".join(step))
        rows = steps * batch
        dev = "device=_dev, dtype=torch.float32"
        state = [f"{name}_h = torch.empty({[layers * dirs, batch, hidden]}, {dev})"]
        if lstm:
            state.append(f"{name}_c = torch.empty({[layers * dirs, batch, hidden]}, {dev})")
        lines = [
            f"# {node.op}: {layers} layer(s) x {dirs} direction(s), {steps} steps of {batch}, "
            f"hidden {hidden}; cuBLAS for the projections, {kernel}_step for the gates",
            *state,
            f"{name}_hp = torch.empty({[batch, hidden]}, {dev})",
            f"{name}_g = torch.empty({[rows, gates]}, {dev})",
            f"{name}_q = torch.empty({[batch, gates]}, {dev})",
        ]
        c_arg = f"{name}_c, " if lstm else ""
        source = _py(x)
        for layer in range(layers):
            width = xs[2] if layer == 0 else dirs * hidden
            out = f"{name}_y{layer}"
            lines.append(f"{out} = torch.empty({[*xs[:2], dirs * hidden]}, {dev})")
            for d in range(dirs):
                slot = layer * dirs + d
                w_ih, w_hh, *b = (_py(r) for r in params[slot * per : (slot + 1) * per])
                biases = f"{b[0]}, {b[1]}, " if bias else ""
                order = f"range({steps - 1}, -1, -1)" if d else f"range({steps})"
                lines += [
                    f"KERNELS.{kernel}_init({grid}, {block}, {_py(h0)}, "
                    + (f"{_py(c0)}, " if lstm else "")
                    + f"{name}_hp, {name}_h, {c_arg}{slot})",
                    f"_sgemm(1, 0, {gates}, {rows}, {width}, {w_ih}, {width}, 0, {source}, "
                    f"{width}, 0, {name}_g, {gates}, {rows * gates}, 1)",
                    f"for _t in {order}:",
                    f"    _sgemm(1, 0, {gates}, {batch}, {hidden}, {w_hh}, {hidden}, 0, "
                    f"{name}_hp, {hidden}, 0, {name}_q, {gates}, {batch * gates}, 1)",
                    f"    KERNELS.{kernel}_step({grid}, {block}, {name}_g, {name}_q, {biases}"
                    f"{name}_hp, {c_arg}{name}_h, {out}, _t, {slot}, {d})",
                ]
            source = out
        outputs = [source, f"{name}_h", *([f"{name}_c"] if lstm else [])]
        lines.append(f"{name} = ({', '.join(outputs)})")
        return lines
