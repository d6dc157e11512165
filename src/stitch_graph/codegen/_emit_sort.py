"""Sorting along one dim (``sort_values``, ``sort_indices``): a block per line, a bitonic sort
in shared memory.

``topk``, ``kthvalue``, ``median``, ``quantile``, ``msort`` and ``argsort`` are captured as this
sort and a view or a few pointwise ops of its result, so one kernel covers them all. Floats are
sorted as unsigned keys whose order is the float order with NaN last (first when descending), so
the values match ``torch.sort``'s, NaN included. For indices each key carries its position in
its low 32 bits: ties keep their order, as a stable sort does. Lines longer than
``MAX_SORT_LINE`` elements (``MAX_ARGSORT_LINE`` with indices) stay in PyTorch. ``_SortEmitter`` is a
mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stitch_graph.codegen._emit_base import _CTYPE, _MAX_GRID, _Args, _EmitterBase, _line_layout
from stitch_graph.codegen._emit_reduce import _two_stage_launch
from stitch_graph.codegen.ir import Group, OpNode, Ref, numel
from stitch_graph.codegen.tuning import KernelTuning

MAX_SORT_LINE = 8192  # keys a block holds in shared memory: 32 KiB of the static 48 KiB
MAX_ARGSORT_LINE = 4096  # keys with their positions: 8 bytes each
MAX_TOPK = 2048  # a topk of a longer line holds its k keys with positions: 16 KiB


def _key(value: str, descending: bool, *, signed_zero: bool = True) -> list[str]:
    """Lines setting ``key``: the float's bits mapped so that unsigned order is float order.

    Negative floats have their bits flipped, the others their sign bit set; NaN becomes the
    largest key, and descending order flips every key (NaN then the smallest). Without
    ``signed_zero``, -0 and +0 share a key (they are equal to PyTorch: their positions keep
    their order)."""
    flip = "~" if descending else ""
    nan = "0u" if descending else "0xFFFFFFFFu"
    return [
        f"const float x = {value}{'' if signed_zero else ' + 0.f'};",
        "const unsigned int u = __float_as_uint(x);",
        f"key = isnan(x) ? {nan} : {flip}((u & 0x80000000u) ? ~u : (u | 0x80000000u));",
    ]


def _value(key: str, descending: bool) -> str:
    """The float whose key is ``key`` (the inverse of ``_key``)."""
    k = f"(~{key})" if descending else key
    return f"__uint_as_float(({k} & 0x80000000u) ? ({k} & 0x7FFFFFFFu) : ~{k})"


def _bitonic(keys: str, key_t: str, padded: int, threads: int) -> list[str]:
    """Lines sorting the ``padded`` (a power of two) keys of shared array ``keys`` ascending:
    the bitonic network, a barrier per stage."""
    return [
        f"    for (int size = 2; size <= {padded}; size <<= 1) {{",
        "      for (int stride = size >> 1; stride > 0; stride >>= 1) {",
        f"        for (int t = threadIdx.x; t < {padded // 2}; t += {threads}) {{",
        "          const int lo = ((t & ~(stride - 1)) << 1) | (t & (stride - 1));",
        f"          const {key_t} a = {keys}[lo], c = {keys}[lo + stride];",
        f"          if ((a > c) == ((lo & size) == 0)) {{ {keys}[lo] = c; {keys}[lo + stride] = a; }}",
        "        }",
        "        __syncthreads();",
        "      }",
        "    }",
    ]


@dataclass
class _LineCode:
    """What a line kernel computes besides its ordering: the prologue on input element ``i``
    and the input's value there; the epilogue on the ordered value ``v_<node>`` at output
    element ``i`` and the result it stores."""

    node: OpNode
    args: _Args
    pre: list[str]
    value: str
    post: list[str]
    result: str
    otype: str

    def store(
        self, var: str, count: int, threads: int, position: str, index: str, stored: str
    ) -> list[str]:
        """Lines storing a line's ``count`` ordered results: element ``var`` at ``position``,
        the key it read as ``stored``, the epilogue applied."""
        ctype = "long long" if self.node.dtype == "int64" else "float"
        return [
            f"    for (int {var} = threadIdx.x; {var} < {count}; {var} += {threads}) {{",
            f"      const {index} i = {position};",
            f"      const {ctype} v_{self.node.name} = {stored};",
            *(f"      {line}" for line in self.post),
            f"      out[i] = {self.result};",
            "    }",
        ]


class _SortEmitter(_EmitterBase):
    """The ``sort_values``, ``sort_indices``, ``topk_values`` and ``topk_indices`` kernels of
    a scan group."""

    def _line_code(self, g: Group, node: OpNode, x: Ref) -> _LineCode:
        """The group's prologue and epilogue around ``node``, which orders ``x``'s lines."""
        args = _Args(self.ir)
        xs = self.ir.shapes[x]
        env: dict[str, str] = {}
        pre = self.exprs(g.prologue, xs, "i", env, args)
        value = self.value_of(x, xs, "i", env, args)
        post_env = {node.name: f"v_{node.name}"}  # the prologue's values are the kernel's alone
        post = self.exprs(g.epilogue, tuple(node.shape), "i", post_env, args)
        out = self.ir.node(g.output)
        otype = _CTYPE.get(out.dtype, "float")
        return _LineCode(node, args, pre, value, post, post_env[out.name], otype)

    def sort_lines(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Sorted values (or their positions) along ``dim``, the prologue applied on load and the
        epilogue on store.

        A block per line (grid-stride over lines) loads the line's keys, pads them to a power
        of two with the key that sorts last, runs the bitonic network with a barrier per
        stage, and stores the first ``length`` keys back as floats (or positions)."""
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        xs = ir.shapes[x]
        dim = int(node.args["dim"]) % max(len(xs), 1)
        descending = bool(node.args.get("descending", False))
        indices = node.op == "sort_indices"
        key_t = "unsigned long long" if indices else "unsigned int"
        last = "0xFFFFFFFFFFFFFFFFull" if indices else "0xFFFFFFFFu"
        length, inner, lines_n, base = _line_layout(xs, dim)
        padded = 1 << max(1, math.ceil(math.log2(max(length, 2))))
        threads = max(32, min(tun.block_size, 1024, padded // 2))
        index = "long long" if numel(xs) >= 2**31 else "int"
        code = self._line_code(g, node, x)
        order = "descending" if descending else "ascending"
        stored = "(long long)(keys[k] & 0xFFFFFFFFull)" if indices else _value("keys[k]", descending)
        src = [
            f"// sort ({order}{', positions' if indices else ''}) along {length} element(s) of "
            f"{lines_n} line(s): a block per line, bitonic over {padded} keys in shared memory",
            f'extern "C" __global__ __launch_bounds__({threads}) void {kernel}('
            f"{code.args.signature([f'{code.otype}* __restrict__ out'])}) {{",
            f"  __shared__ {key_t} keys[{padded}];",
            f"  for ({index} r = blockIdx.x; r < {lines_n}; r += gridDim.x) {{",
            f"    const {index} b = {base};",
            f"    for (int k = threadIdx.x; k < {padded}; k += {threads}) {{",
            f"      {key_t} slot = {last};  // padding sorts last",
            f"      if (k < {length}) {{",
            f"        const {index} i = b + ({index})k * {inner};",
            "        unsigned int key;",
            *(f"        {line}" for line in code.pre),
            *(f"        {line}" for line in _key(code.value, descending, signed_zero=not indices)),
            "        slot = " + ("((unsigned long long)key << 32) | (unsigned int)k;" if indices else "key;"),  # noqa: E501
            "      }",
            "      keys[k] = slot;",
            "    }",
            "    __syncthreads();",
            *_bitonic("keys", key_t, padded, threads),
            *code.store("k", length, threads, f"b + ({index})k * {inner}", index, stored),
            "    __syncthreads();  // the next line reuses the keys",
            "  }",
            "}",
        ]
        grid = max(1, min(lines_n, _MAX_GRID))
        return self._add_kernel(src, kernel, grid, threads, code.args, ir.node(g.output))

    def top_lines(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """The ``k`` best keys of each line, in order (``topk_values``, ``topk_indices``), for
        lines too long to sort in one block.

        A block per line finds the k-th key by radix select (``_radix_select``), gathers the k
        keys at or below it into shared memory, sorts and stores them. Keys carry their
        positions, so ties go to the first position, as in PyTorch, and exactly k keys are
        gathered. Where a few lines would leave most SMs idle, each line is cut into chunks
        (``_topk_chunks``): a block per chunk selects the chunk's k best keys into a workspace,
        then a block per line selects the k best of those."""
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        xs = ir.shapes[x]
        dim = int(node.args["dim"]) % max(len(xs), 1)
        k = int(node.args["k"])
        largest = bool(node.args.get("largest", True))
        indices = node.op == "topk_indices"
        length, inner, lines_n, base = _line_layout(xs, dim)
        _, out_inner, _, out_base = _line_layout(tuple(node.shape), dim)
        padded = 1 << max(1, math.ceil(math.log2(max(k, 2))))
        threads = max(64, min(tun.block_size, 1024))
        index = "long long" if numel(xs) >= 2**31 else "int"
        code = self._line_code(g, node, x)
        # the position's digits: only those its largest value reaches
        shifts = [56, 48, 40, 32, *(s for s in (24, 16, 8, 0) if s == 0 or (length - 1) >> s)]
        load = [
            f"        const {index} i = b + ({index})e * {inner};",
            "        unsigned int key;",
            *(f"        {line}" for line in code.pre),
            *(f"        {line}" for line in _key(code.value, largest, signed_zero=not indices)),
            "        const unsigned long long full = ((unsigned long long)key << 32) | (unsigned int)e;",  # noqa: E501
        ]
        stored = "(long long)(sel[j] & 0xFFFFFFFFull)" if indices else _value("(unsigned int)(sel[j] >> 32)", largest)  # noqa: E501
        what = f"topk ({'largest' if largest else 'smallest'} {k}{', positions' if indices else ''})"
        chunks = _topk_chunks(lines_n, length, k, tun.split_reduction)
        final_loop, final_load = f"int e = threadIdx.x; e < {length}", load
        params: list[str] = []
        if chunks > 1:
            span = math.ceil(length / chunks)
            chunks = math.ceil(length / span)  # none empty
            src = [
                f"// {what}, first stage: {lines_n} line(s) of {length} element(s) in {chunks} "
                f"chunks of {span}, a block per chunk selecting its {k} best keys",
                f'extern "C" __global__ __launch_bounds__({threads}) void {kernel}_part('
                f"{code.args.signature(['unsigned long long* __restrict__ cand'])}) {{",
                *_select_shared(shifts, padded),
                f"  for (int q = blockIdx.x; q < {lines_n * chunks}; q += gridDim.x) {{",
                f"    const {index} r = q / {chunks};",
                f"    const {index} b = {base};",
                f"    const int e0 = (q % {chunks}) * {span};",
                f"    const int e1 = e0 + {span} < {length} ? e0 + {span} : {length};",
                *_radix_select(
                    f"e1 - e0 < {k} ? e1 - e0 : {k}",
                    "int e = e0 + threadIdx.x; e < e1", load, threads, padded,
                ),
                f"    for (int j = threadIdx.x; j < {k}; j += {threads}) "
                f"cand[(long long)q * {k} + j] = sel[j];",
                "    __syncthreads();  // the next chunk reuses the shared arrays",
                "  }",
                "}",
            ]
            self.kernels.append("\n".join(src))
            final_loop = f"int e = threadIdx.x; e < {chunks * k}"
            final_load = [
                f"        const unsigned long long full = cand[(long long)r * {chunks * k} + e];"
            ]
            params = ["const unsigned long long* __restrict__ cand"]
        among = f" among the chunks' {chunks * k} best" if chunks > 1 else ""
        src = [
            f"// {what} of {length} element(s) in {lines_n} line(s): a block per line, radix "
            f"select of the k-th key{among}, the {k} keys sorted in shared memory",
            f'extern "C" __global__ __launch_bounds__({threads}) void {kernel}('
            f"{code.args.signature([*params, f'{code.otype}* __restrict__ out'])}) {{",
            *_select_shared(shifts, padded),
            f"  for ({index} r = blockIdx.x; r < {lines_n}; r += gridDim.x) {{",
            f"    const {index} b = {base};",
            *_radix_select(str(k), final_loop, final_load, threads, padded),
            *_bitonic("sel", "unsigned long long", padded, threads),
            *code.store("j", k, threads, f"{out_base} + ({index})j * {out_inner}", index, stored),
            "    __syncthreads();  // the next line reuses the shared arrays",
            "  }",
            "}",
        ]
        grid = max(1, min(lines_n, _MAX_GRID))
        out = ir.node(g.output)
        if chunks == 1:
            return self._add_kernel(src, kernel, grid, threads, code.args, out)
        self.kernels.append("\n".join(src))
        first = (max(1, min(lines_n * chunks, _MAX_GRID)), threads)
        return _two_stage_launch(
            g, kernel, out, code.args, code.args, lines_n * chunks * k, first, (grid, threads),
            bytes_each=8,
        )


def _topk_chunks(lines: int, length: int, k: int, split: bool | None) -> int:
    """Blocks that share one line of a top-k: enough for about ``_TOPK_BLOCKS`` blocks where a
    few long lines would each hold one SM (8 lines of 672,000: 8 SMs of 132 busy), each chunk
    at least 8k long so that the second stage reads a small share of the line. ``split``
    forces either form where the line is long enough."""
    if split is False:
        return 1
    most = length // (8 * k)
    want = max(2, _TOPK_BLOCKS // lines) if split else _TOPK_BLOCKS // lines
    chunks = min(want, most, 64)
    return chunks if chunks >= 2 else 1


_TOPK_BLOCKS = 256  # two blocks an SM of an H100 or H200


def _select_shared(shifts: list[int], padded: int) -> list[str]:
    """The shared arrays and digit order of ``_radix_select``."""
    return [
        "  __shared__ unsigned int hist[256];",
        f"  __shared__ unsigned long long sel[{padded}];",
        "  __shared__ unsigned long long s_prefix;",
        "  __shared__ unsigned int s_need, s_done, s_count;",
        f"  const int shifts[{len(shifts)}] = {{{', '.join(map(str, shifts))}}};",
    ]


def _radix_select(need0: str, loop: str, load: list[str], threads: int, padded: int) -> list[str]:
    """Lines leaving in ``sel`` (padded with the last key) the ``need0`` smallest 64-bit keys
    ``full`` that ``load`` reads for each ``e`` of ``loop``: each pass histograms one 8-bit
    digit over the keys that match the digits found so far, and a warp picks the digit holding
    the need-th key; it stops once that digit's keys are all wanted."""
    return [
        "    unsigned long long prefix = 0ull, mask = 0ull;",
        f"    unsigned int need = {need0};",
        "    #pragma unroll",
        "    for (int p = 0; p < (int)(sizeof(shifts) / sizeof(int)); ++p) {",
        "      const int shift = shifts[p];",
        f"      for (int d = threadIdx.x; d < 256; d += {threads}) hist[d] = 0u;",
        "      __syncthreads();",
        f"      for ({loop}; e += {threads}) {{",
        *load,
        "        if ((full & mask) == prefix) atomicAdd(&hist[(full >> shift) & 255u], 1u);",
        "      }",
        "      __syncthreads();",
        "      if (threadIdx.x < 32) {  // a warp finds the digit holding the need-th key",
        "        unsigned int c[8], sum = 0u;",
        "        for (int j = 0; j < 8; ++j) { c[j] = hist[threadIdx.x * 8 + j]; sum += c[j]; }",
        "        unsigned int upto = sum;",
        "        for (int o = 1; o < 32; o <<= 1) {",
        "          const unsigned int t = __shfl_up_sync(0xFFFFFFFFu, upto, o);",
        "          if (threadIdx.x >= o) upto += t;",
        "        }",
        "        unsigned int before = upto - sum;",
        "        if (before < need && need <= upto) {",
        "          int j = 0;",
        "          while (before + c[j] < need) before += c[j++];",
        "          s_prefix = prefix | ((unsigned long long)(threadIdx.x * 8 + j) << shift);",
        "          s_need = need - before;",
        "          s_done = c[j] == need - before;",
        "        }",
        "      }",
        "      __syncthreads();",
        "      prefix = s_prefix;",
        "      mask |= 255ull << shift;",
        "      need = s_need;",
        "      const bool done = s_done;",
        "      __syncthreads();  // every thread has read the digit before the next pass",
        "      if (done) break;",
        "    }",
        f"    for (int j = threadIdx.x; j < {padded}; j += {threads}) sel[j] = ~0ull;",
        "    if (threadIdx.x == 0) s_count = 0u;",
        "    __syncthreads();",
        f"    for ({loop}; e += {threads}) {{",
        *load,
        "        if ((full & mask) <= prefix) sel[atomicAdd(&s_count, 1u)] = full;",
        "    }",
        "    __syncthreads();",
    ]
