"""Sorting along one dim (``sort_values``, ``sort_indices``): a block per line, a bitonic sort
in shared memory.

``topk``, ``kthvalue``, ``median``, ``quantile``, ``msort`` and ``argsort`` are captured as this
sort and a view or a few pointwise ops of its result, so one kernel covers them all. Floats are
sorted as unsigned keys whose order is the float order with NaN last (first when descending), so
the values match ``torch.sort``'s, NaN included. For indices each key carries its position in
its low 32 bits: ties keep their order, as a stable sort does. Lines of ``MAX_SORT_LINE``
elements or more (``MAX_ARGSORT_LINE`` with indices) stay in PyTorch. ``_SortEmitter`` is a
mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math

from stitch_graph.codegen._emit_base import _CTYPE, _MAX_GRID, _Args, _EmitterBase, _line_layout
from stitch_graph.codegen.ir import Group, Ref, numel
from stitch_graph.codegen.tuning import KernelTuning

MAX_SORT_LINE = 8192  # keys a block holds in shared memory: 32 KiB of the static 48 KiB
MAX_ARGSORT_LINE = 4096  # keys with their positions: 8 bytes each


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


class _SortEmitter(_EmitterBase):
    """The ``sort_values`` and ``sort_indices`` kernels of a scan group."""

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
        out = ir.node(g.output)
        args = _Args(ir)
        env: dict[str, str] = {}
        pre = self.exprs(g.prologue, xs, "i", env, args)
        value = self.value_of(x, xs, "i", env, args)
        post_env = {node.name: f"v_{node.name}"}  # the prologue's values are the sort's alone
        post = self.exprs(g.epilogue, xs, "i", post_env, args)
        otype = _CTYPE.get(out.dtype, "float")
        order = "descending" if descending else "ascending"
        stored = "(long long)(keys[k] & 0xFFFFFFFFull)" if indices else _value("keys[k]", descending)
        src = [
            f"// sort ({order}{', positions' if indices else ''}) along {length} element(s) of "
            f"{lines_n} line(s): a block per line, bitonic over {padded} keys in shared memory",
            f'extern "C" __global__ __launch_bounds__({threads}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  __shared__ {key_t} keys[{padded}];",
            f"  for ({index} r = blockIdx.x; r < {lines_n}; r += gridDim.x) {{",
            f"    const {index} b = {base};",
            f"    for (int k = threadIdx.x; k < {padded}; k += {threads}) {{",
            f"      {key_t} slot = {last};  // padding sorts last",
            f"      if (k < {length}) {{",
            f"        const {index} i = b + ({index})k * {inner};",
            "        unsigned int key;",
            *(f"        {line}" for line in pre),
            *(f"        {line}" for line in _key(value, descending, signed_zero=not indices)),
            "        slot = " + ("((unsigned long long)key << 32) | (unsigned int)k;" if indices else "key;"),  # noqa: E501
            "      }",
            "      keys[k] = slot;",
            "    }",
            "    __syncthreads();",
            f"    for (int size = 2; size <= {padded}; size <<= 1) {{",
            "      for (int stride = size >> 1; stride > 0; stride >>= 1) {",
            f"        for (int t = threadIdx.x; t < {padded // 2}; t += {threads}) {{",
            "          const int lo = ((t & ~(stride - 1)) << 1) | (t & (stride - 1));",
            f"          const {key_t} a = keys[lo], c = keys[lo + stride];",
            "          if ((a > c) == ((lo & size) == 0)) { keys[lo] = c; keys[lo + stride] = a; }",
            "        }",
            "        __syncthreads();",
            "      }",
            "    }",
            f"    for (int k = threadIdx.x; k < {length}; k += {threads}) {{",
            f"      const {index} i = b + ({index})k * {inner};",
            f"      const {'long long' if indices else 'float'} v_{node.name} = {stored};",
            *(f"      {line}" for line in post),
            f"      out[i] = {post_env[out.name]};",
            "    }",
            "    __syncthreads();  // the next line reuses the keys",
            "  }",
            "}",
        ]
        grid = max(1, min(lines_n, _MAX_GRID))
        return self._add_kernel(src, kernel, grid, threads, args, out)
