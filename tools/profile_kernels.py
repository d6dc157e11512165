"""Where the GPU time goes, eager (and ``torch.compile`` with ``--compile``) against the
generated program: one forward of each under torch.profiler, kernels grouped by name with
their counts and summed device time.

The generated program is the rule-based one, untuned and without graph replay, so each launch
is its own kernel; weights are the reference's. Quicker than ``profile_program.py`` (no ncu
replay), and it names the library kernels eager runs, which says whether a gap is the choice
of a library algorithm or the generated kernels.

Usage: ``PYTHONPATH=src python tools/profile_kernels.py PROBLEM.py [...] [--compile]``
"""

from __future__ import annotations

import collections
import sys
import tempfile
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from stitch_graph.codegen import Tuning, capture_program, emit_candidate, plan_program
from stitch_graph.execution._common import load_module_state, module_state
from stitch_graph.execution.forms import load_model_class
from stitch_graph.runtime.problem_source import exec_problem
from stitch_graph.task import load_task


def table(fn: Any, label: str, top: int = 14) -> None:
    """Print the ``top`` kernel names of one call of ``fn`` by summed device time."""
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = by_name[event.name[:110]]
            entry[0] += 1
            entry[1] += event.device_time / 1000
    total = sum(v[1] for v in by_name.values())
    count = sum(v[0] for v in by_name.values())
    print(f"== {label}: {count} kernels, {total:.3f} ms GPU")
    for name, (n, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {ms:8.3f} ms  x{int(n):<4d} {name}")


def main(paths: list[str], with_compile: bool = False) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for path in paths:
        task = load_task(path)
        ir = capture_program(task)
        plan = plan_program(ir)
        program = emit_candidate(ir, plan, tuning=Tuning(cuda_graph=False))
        namespace = exec_problem(task.source, path, "reference")
        torch.manual_seed(0)
        reference = namespace["Model"](*namespace["get_init_inputs"]()).cuda()
        model = load_model_class(program, tempfile.mkdtemp(), None)(
            *namespace["get_init_inputs"]()
        ).cuda()
        load_module_state(model, module_state(reference))
        inputs = [t.cuda() if torch.is_tensor(t) else t for t in namespace["get_inputs"]()]
        print(f"# {task.name}")
        table(lambda: reference(*inputs), "eager")  # noqa: B023 - called at once
        if with_compile:
            compiled = torch.compile(reference)
            table(lambda: compiled(*inputs), "torch.compile")  # noqa: B023
        table(lambda: model(*inputs), "generated")  # noqa: B023


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if a != "--compile"], "--compile" in sys.argv[1:])
