"""LSTM, GRU and Elman RNN layers: cuBLAS GEMMs and one generated gate kernel a time step.

Per layer and direction, one SGEMM projects the inputs of every time step at once
(``G = X W_ih^T``); then each step multiplies the hidden state by ``W_hh^T`` (``Q = h W_hh^T``)
and one kernel applies the gates, with both biases, to update the cell and hidden state in place
and write the step's output. Gate order and formulas are PyTorch's (LSTM: i, f, g, o; GRU: r, z,
n with ``n = tanh(G_n + b_in + r * (Q_n + b_hn))``; ``nn.RNN``: ``tanh`` or ``relu`` of the sum).
The host loop is launch-bound, so the plan asks for CUDA-graph replay.

``_RnnEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math
from typing import Any

from stitch_graph.codegen._emit_base import EmitError, _EmitterBase, _py
from stitch_graph.codegen._rnn_fit import persistent_fit
from stitch_graph.codegen.ir import Group, Ref
from stitch_graph.codegen.tuning import KernelTuning

_SIGMOID = "(1.f / (1.f + expf(-({}))))"
_ELEMENTS = "  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < N; e += gridDim.x * blockDim.x) {"


def _q_global(k: int) -> str:
    """The hidden projection of gate ``k`` from the step's SGEMM output."""
    return f"qr[{k} * H + j]"


def _q_shared(k: int) -> str:
    """The hidden projection of gate ``k`` from the fused step's shared memory."""
    return f"qs[(b * G + {k}) * JB + jj]"


def _g_global(k: int) -> str:
    """The input projection of gate ``k`` from the step's row of the projection buffer."""
    return f"gr[{k} * H + j]"


def _lstm_update(
    bias: bool, q: Any = _q_global, cell: str = "c[slot + e]", g: Any = _g_global
) -> list[str]:
    """Gate lines of one LSTM element: ``g(k)`` is the step's input projection of (b, t),
    ``q(k)`` its hidden projection, ``cell`` where its cell state is kept."""
    def gate(k: int) -> str:
        terms = [g(k), q(k)]
        if bias:
            terms += [f"bi[{k} * H + j]", f"bh[{k} * H + j]"]
        return " + ".join(terms)

    return [
        f"const float ig = {_SIGMOID.format(gate(0))};",
        f"const float fg = {_SIGMOID.format(gate(1))};",
        f"const float gg = tanhf({gate(2)});",
        f"const float og = {_SIGMOID.format(gate(3))};",
        f"const float cn = fg * {cell} + ig * gg;",
        f"{cell} = cn;",
        "const float hv = og * tanhf(cn);",
    ]


def _gru_update(
    bias: bool, q: Any = _q_global, prev: str = "hp[e]", g: Any = _g_global
) -> list[str]:
    """Gate lines of one GRU element (``prev`` is the previous hidden state)."""
    def part(k: int, source: str) -> str:
        own, value = ("bi", g(k)) if source == "gr" else ("bh", q(k))
        return value + (f" + {own}[{k} * H + j]" if bias else "")

    return [
        f"const float rg = {_SIGMOID.format(part(0, 'gr') + ' + ' + part(0, 'qr'))};",
        f"const float zg = {_SIGMOID.format(part(1, 'gr') + ' + ' + part(1, 'qr'))};",
        f"const float ng = tanhf({part(2, 'gr')} + rg * ({part(2, 'qr')}));",
        f"const float hv = (1.f - zg) * ng + zg * {prev};",
    ]


def _elman_update(bias: bool, relu: bool, q: Any = _q_global, g: Any = None) -> list[str]:
    """The update of one element of ``nn.RNN``: ``tanh`` (or ``relu``) of both projections and
    both biases, summed in PyTorch's order."""
    first = g(0) if g else "gr[j]"
    terms = [first, *(["bi[j]"] if bias else []), q(0), *(["bh[j]"] if bias else [])]
    total = " + ".join(terms)
    return [f"const float hv = {f'sg_max({total}, 0.f)' if relu else f'tanhf({total})'};"]


def _update(
    op: str, bias: bool, q: Any = _q_global, cell: str = "c[slot + e]", prev: str = "hp[e]",
    g: Any = None,
) -> list[str]:
    """The gate lines of ``op``'s element update."""
    if op == "lstm":
        return _lstm_update(bias, q, cell, g or _g_global)
    if op == "gru":
        return _gru_update(bias, q, prev, g or _g_global)
    return _elman_update(bias, op == "rnn_relu", q, g)


def _gates_and_writes(update: list[str], state: str) -> list[str]:
    """Loop-body lines for element ``e`` (batch row ``b``, hidden unit ``j``) of step ``t``: the
    gates, then the new hidden value into ``state``, the layer's last state and the output."""
    return [
        "    const long long row = b * SB + t * ST;",
        "    const float* gr = gx + row * GH;",
        *(f"    {line}" for line in update),
        f"    {state}[e] = hv;",
        "    hn[slot + e] = hv;",
        "    y[row * DH + d * H + j] = hv;",
    ]


def _head(block: int, name: str, params: list[str]) -> str:
    """The opening line of a launchable kernel."""
    return f'extern "C" __global__ __launch_bounds__({block}) void {name}({", ".join(params)}) {{'


class _RnnEmitter(_EmitterBase):
    """Host loop and kernels of an ``lstm``/``gru``/``rnn_tanh``/``rnn_relu`` node (``rnn``)."""

    def rnn(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        if tun.rnn_library:  # the declared library anchor: the item stays in PyTorch (cuDNN)
            msg = f"{node.name}: PyTorch's cuDNN RNN chosen by the tuning (rnn_library)"
            raise EmitError(msg)
        lstm = node.op == "lstm"
        x: Ref = node.args["input"]
        hx = node.args["hx"]
        h0, c0 = (hx[0], hx[1]) if lstm else (hx if isinstance(hx, Ref) else hx[0], None)
        params: list[Ref] = list(node.args["params"])
        bias = bool(node.args.get("has_biases"))
        dirs = 2 if node.args.get("bidirectional") else 1
        batch_first = bool(node.args.get("batch_first"))
        xs = ir.shapes[x]
        steps, batch = (xs[1], xs[0]) if batch_first else (xs[0], xs[1])
        gates, hidden = ir.shapes[params[1]]  # weight_hh: (gates * H, H)
        n = batch * hidden
        block = min(max(tun.block_size, 32), 1024)
        grid = max(1, math.ceil(n / block))
        sb, st = (steps, 1) if batch_first else (1, batch)  # row of (b, t) = b * sb + t * st
        consts = [
            f"constexpr int H = {hidden}, GH = {gates}, N = {n}, DH = {dirs * hidden};",
            f"constexpr long long SB = {sb}, ST = {st};",
        ]
        # every step in one kernel where W_hh fits in a block's registers: a block a few batch
        # rows, its state in shared memory, one barrier a step and no launch
        fit = persistent_fit(gates // hidden, hidden, batch, tun.rows_per_block)
        if tun.fuse and tun.rnn_persistent is not False and fit is not None:
            return self._persistent_rnn(node, kernel, consts, fit)
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
        # one kernel a step where the hidden state fits in shared memory: each block multiplies
        # it by its rows of W_hh (a warp a row, every batch row at once), then applies the gates
        fused = tun.fuse and batch <= 32 and batch * hidden <= 8192
        if fused:
            return self._fused_rnn(node, kernel, init, consts, c_out, block)
        update = _update(node.op, bias)
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
            "    const float* qr = gh + (long long)b * GH;",
            *_gates_and_writes(update, "hp"),
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(init))
        self.kernels.append("\n".join(step))
        return self._rnn_host(node, kernel, grid, block, fused=False)

    def _fused_rnn(
        self, node: Any, kernel: str, init: list[str], consts: list[str], c_out: list[str],
        block: int,
    ) -> list[str]:
        """The fused step kernel (hidden projection and gates) and its host loop."""
        ir = self.ir
        bias = bool(node.args.get("has_biases"))
        xs = ir.shapes[node.args["input"]]
        batch = xs[0] if node.args.get("batch_first") else xs[1]
        gates_h, hidden = ir.shapes[node.args["params"][1]]
        gates = gates_h // hidden
        per_block = max(1, math.ceil(hidden / 128))  # hidden units a block: about 128 blocks
        grid = math.ceil(hidden / per_block)
        warps = block // 32
        q = _q_shared
        update = _update(node.op, bias, q)
        step = [
            f"// {node.op} time step, fused: {batch} x {hidden} hidden units, {per_block} a block",
            _head(block, f"{kernel}_step", [
                "const float* __restrict__ gx", "const float* __restrict__ whh",
                *(["const float* __restrict__ bi", "const float* __restrict__ bh"] if bias else []),
                "const float* __restrict__ hp", "float* __restrict__ hq", *c_out,
                "float* __restrict__ hn", "float* __restrict__ y", "int t", "int s", "int d",
            ]),
            *(f"  {line}" for line in consts),
            f"  constexpr int B = {batch}, G = {gates}, JB = {per_block};",
            "  __shared__ float hs[B * H];",
            "  __shared__ float qs[B * G * JB];",
            "  const long long slot = (long long)s * N;",
            "  const int j0 = blockIdx.x * JB;",
            f"  for (int e = threadIdx.x; e < B * H; e += {block}) hs[e] = hp[e];",
            "  __syncthreads();",
            "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;",
            f"  for (int r = warp; r < G * JB; r += {warps}) {{",
            "    const int k = r / JB, jj = r % JB;",
            "    float acc[B];",
            "#pragma unroll",
            "    for (int b = 0; b < B; ++b) acc[b] = 0.f;",
            "    if (j0 + jj < H) {",
            "      const float* w = whh + (long long)(k * H + j0 + jj) * H;",
            "      for (int i = lane; i < H; i += 32) {",
            "        const float wv = w[i];",
            "#pragma unroll",
            "        for (int b = 0; b < B; ++b) acc[b] += wv * hs[b * H + i];",
            "      }",
            "    }",
            "#pragma unroll",
            "    for (int b = 0; b < B; ++b) {",
            "      float v = acc[b];",
            "      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SG_FULL, v, o);",
            "      if (lane == 0) qs[(b * G + k) * JB + jj] = v;",
            "    }",
            "  }",
            "  __syncthreads();",
            f"  for (int u = threadIdx.x; u < B * JB; u += {block}) {{",
            "    const int b = u / JB, jj = u % JB, j = j0 + jj;",
            "    if (j >= H) continue;",
            "    const int e = b * H + j;",
            *_gates_and_writes(update, "hq"),
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(init))
        self.kernels.append("\n".join(step))
        return self._rnn_host(node, kernel, grid, block, fused=True)

    def _persistent_rnn(
        self, node: Any, kernel: str, consts: list[str], fit: tuple[int, int, int]
    ) -> list[str]:
        """The kernel that runs every time step of one layer and direction, and its host
        lines. Hidden unit ``j`` has ``S`` threads; thread ``j * S + p`` holds every ``S``-th
        weight from ``p`` of the unit's gate rows in registers, the ``S`` threads sum their
        products by shuffles and the first applies the gates, so a step needs one barrier
        (the state alternates between two buffers). Biases are folded into both
        projections (PyTorch adds the same four terms)."""
        ir = self.ir
        lanes, threads, rb = fit
        lstm = node.op == "lstm"
        bias = bool(node.args.get("has_biases"))
        xs = ir.shapes[node.args["input"]]
        steps, batch = (xs[1], xs[0]) if node.args.get("batch_first") else (xs[0], xs[1])
        gates_h, hidden = ir.shapes[node.args["params"][1]]
        gates = gates_h // hidden
        update = _update(node.op, False, q=lambda k: f"q[{k}]", cell="cl[b]",
                         prev="hc[b * HP + j]", g=lambda k: f"gv[b][{k}]")
        per = math.ceil(hidden / lanes)
        bias_of = "(j < H ? {}[k * H + j] : 0.f)" if bias else "0.f"
        seq = [
            f"// {node.op}, every time step in one kernel: {rb} batch row(s) a block, W_hh in "
            f"registers ({gates} x {per} weights a thread, {lanes} thread(s) a "
            "hidden unit)",
            _head(threads, f"{kernel}_seq", [
                "const float* __restrict__ gx", "const float* __restrict__ whh",
                *(["const float* __restrict__ bi", "const float* __restrict__ bh"] if bias else []),
                "const float* __restrict__ h0", *(["const float* __restrict__ c0"] if lstm else []),
                "float* __restrict__ hn", *(["float* __restrict__ c"] if lstm else []),
                "float* __restrict__ y", "int s", "int d",
            ]),
            *(f"  {line}" for line in consts),
            f"  constexpr int B = {batch}, RB = {rb}, S = {lanes}, HS = {per}, HP = {per * lanes}, "
            f"G = {gates}, STEPS = {steps};",
            "  __shared__ float hbuf[2][RB * HP];  // rows padded with zeros to S * HS",
            "  const int tid = threadIdx.x, j = tid / S, p = tid % S, b0 = blockIdx.x * RB;",
            "  const bool lead = p == 0 && j < H;",
            "  const long long slot = (long long)s * N + (long long)b0 * H;",
            f"  for (int e = tid; e < 2 * RB * HP; e += {threads}) {{  // both buffers' pads zero",
            "    const int b = e / HP % RB, i = e % HP;",
            "    (&hbuf[0][0])[e] = e < RB * HP && i < H && b0 + b < B ? h0[slot + b * H + i] : 0.f;",
            "  }",
            "  float cl[RB];",
            "#pragma unroll",
            "  for (int b = 0; b < RB; ++b)",
            "    cl[b] = " + ("lead && b0 + b < B ? c0[slot + b * H + j] : 0.f;" if lstm else "0.f;"),
            "  float w[G][HS], wi[G], wh[G];",
            "#pragma unroll",
            "  for (int k = 0; k < G; ++k) {",
            f"    wi[k] = {bias_of.format('bi')};",
            f"    wh[k] = {bias_of.format('bh')};",
            "#pragma unroll",
            "    for (int i = 0; i < HS; ++i)",
            "      w[k][i] = j < H && i * S + p < H ? whh[(long long)(k * H + j) * H + i * S + p] : 0.f;",
            "  }",
            "  // a step's input projection is loaded a step ahead, while the products run",
            "  float gv[RB][G], gn[RB][G];",
            "#pragma unroll",
            "  for (int b = 0; b < RB; ++b)",
            "#pragma unroll",
            "    for (int k = 0; k < G; ++k)",
            "      gn[b][k] = lead && b0 + b < B"
            " ? gx[((b0 + b) * SB + (d ? STEPS - 1 : 0) * ST) * GH + k * H + j] : 0.f;",
            "  __syncthreads();",
            "  for (int n = 0; n < STEPS; ++n) {",
            "    const int t = d ? STEPS - 1 - n : n, tn = d ? t - 1 : t + 1;",
            "    const float* hc = hbuf[n & 1];",
            "    float* hx = hbuf[(n + 1) & 1];",
            "#pragma unroll",
            "    for (int b = 0; b < RB; ++b)",
            "#pragma unroll",
            "      for (int k = 0; k < G; ++k) {",
            "        gv[b][k] = gn[b][k] + wi[k];",
            "        gn[b][k] = lead && b0 + b < B && n + 1 < STEPS"
            " ? gx[((b0 + b) * SB + tn * ST) * GH + k * H + j] : 0.f;",
            "      }",
            "#pragma unroll",
            "    for (int b = 0; b < RB; ++b) {",
            "      const float* hb = hc + b * HP + p;  // a unit's S threads read S banks",
            "      float q[G];",
            "#pragma unroll",
            "      for (int k = 0; k < G; ++k) {",
            "        float a = 0.f;",
            "#pragma unroll",
            "        for (int i = 0; i < HS; ++i) a += w[k][i] * hb[i * S];",
            "#pragma unroll",
            "        for (int o = S / 2; o > 0; o >>= 1) a += __shfl_xor_sync(SG_FULL, a, o);",
            "        q[k] = a + wh[k];",
            "      }",
            "      if (lead && b0 + b < B) {",
            "        const long long row = (b0 + b) * SB + t * ST;",
            *(f"        {line}" for line in update),
            "        hx[b * HP + j] = hv;",
            "        y[row * DH + d * H + j] = hv;",
            "      }",
            "    }",
            "    __syncthreads();",
            "  }",
            "  const float* hl = hbuf[STEPS & 1];",
            f"  for (int e = tid; e < RB * H; e += {threads})",
            "    if (b0 + e / H < B) hn[slot + e] = hl[e / H * HP + e % H];",
            *(["#pragma unroll",
               "  for (int b = 0; b < RB; ++b)",
               "    if (lead && b0 + b < B) c[slot + b * H + j] = cl[b];"] if lstm else []),
            "}",
        ]
        self.kernels.append("\n".join(seq))
        return self._rnn_host(node, kernel, math.ceil(batch / rb), threads, fused=False,
                              persistent=True)

    def _rnn_host(
        self, node: Any, kernel: str, grid: int, block: int, *, fused: bool,
        persistent: bool = False,
    ) -> list[str]:
        """Host lines: state buffers, then per layer and direction the input projection and
        the step loop (an SGEMM and the gate kernel a step, or the fused kernel alone), or the
        ``persistent`` kernel's one launch."""
        ir = self.ir
        name = node.name
        lstm = node.op == "lstm"
        x: Ref = node.args["input"]
        hx = node.args["hx"]
        h0, c0 = (hx[0], hx[1]) if lstm else (hx if isinstance(hx, Ref) else hx[0], None)
        params: list[Ref] = list(node.args["params"])
        bias = bool(node.args.get("has_biases"))
        dirs = 2 if node.args.get("bidirectional") else 1
        layers = int(node.args["num_layers"])
        xs = ir.shapes[x]
        steps, batch = (xs[1], xs[0]) if node.args.get("batch_first") else (xs[0], xs[1])
        gates, hidden = ir.shapes[params[1]]
        per = 4 if bias else 2
        init_grid = max(1, math.ceil(batch * hidden / block))
        rows = steps * batch
        dev = "device=_dev, dtype=torch.float32"
        state = [f"{name}_h = torch.empty({[layers * dirs, batch, hidden]}, {dev})"]
        if lstm:
            state.append(f"{name}_c = torch.empty({[layers * dirs, batch, hidden]}, {dev})")
        lines = [
            f"# {node.op}: {layers} layer(s) x {dirs} direction(s), {steps} steps of {batch}, "
            f"hidden {hidden}; cuBLAS for the projections, "
            + (f"{kernel}_seq for every step" if persistent else f"{kernel}_step for the gates"),
            *state,
            *([] if persistent else [f"{name}_hp = torch.empty({[batch, hidden]}, {dev})"]),
            *([f"{name}_hb = ({name}_hp, torch.empty({[batch, hidden]}, {dev}))"] if fused else []),
            f"{name}_g = torch.empty({[rows, gates]}, {dev})",
            *([] if fused or persistent else [f"{name}_q = torch.empty({[batch, gates]}, {dev})"]),
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
                projection = (
                    f"_sgemm(1, 0, {gates}, {rows}, {width}, {w_ih}, {width}, 0, {source}, "
                    f"{width}, 0, {name}_g, {gates}, {rows * gates}, 1)"
                )
                if persistent:
                    lines += [
                        projection,
                        f"KERNELS.{kernel}_seq({grid}, {block}, {name}_g, {w_hh}, {biases}"
                        f"{_py(h0)}, " + (f"{_py(c0)}, " if lstm else "")
                        + f"{name}_h, {c_arg}{out}, {slot}, {d})",
                    ]
                    continue
                lines += [
                    f"KERNELS.{kernel}_init({init_grid}, {block}, {_py(h0)}, "
                    + (f"{_py(c0)}, " if lstm else "")
                    + f"{name}_hp, {name}_h, {c_arg}{slot})",
                    projection,
                ]
                if fused:  # the state alternates between two buffers, step by step
                    lines += [
                        f"for _i, _t in enumerate({order}):",
                        f"    KERNELS.{kernel}_step({grid}, {block}, {name}_g, {w_hh}, {biases}"
                        f"{name}_hb[_i % 2], {name}_hb[1 - _i % 2], {c_arg}{name}_h, {out}, "
                        f"_t, {slot}, {d})",
                    ]
                    continue
                lines += [
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
