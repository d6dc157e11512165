"""The ``stitch-graph`` command: optimise a problem, draw the graph, use the knowledge index.

Every ``optimize`` run lives in a folder (``runs/NAME``) with a SQLite checkpoint, so a killed run
continues with ``--resume NAME`` from its last completed step; the folder also receives the final
program, a KernelBench ``ModelNew`` file, the event log and a readable report.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from stitch_graph.cli.models import add_model_options, check_models, context_from_args

RUNS_DIR = Path("runs")


def _describe(event: dict[str, Any]) -> str:
    data = {k: v for k, v in event.items() if k not in ("agent", "event", "time")}
    extra = " ".join(f"{k}={v}" for k, v in data.items() if v not in (None, ""))
    text = escape(f"{event.get('event', '')} {extra}".rstrip())
    return f"[bold]{event.get('agent', '?'):>9}[/bold] {text}"


def _write_outputs(out: Path, state: dict[str, Any]) -> None:
    from stitch_graph.agents.run_folder import write_run

    write_run(state, out)


def _run_folder(name: str) -> Path:
    """The folder ``--resume`` names: a path as given, or a bare run id under ``runs/``."""
    path = Path(name).expanduser()
    if path.is_dir() or path.is_absolute() or len(path.parts) > 1:
        return path
    return RUNS_DIR / name


def _resume_command(out: Path) -> str:
    """The command that continues the run in ``out``, from any working folder."""
    return f"stitch-graph optimize --resume {shlex.quote(str(out.resolve()))}"


def _read_problem(problem: str) -> tuple[str, str | None]:
    """The problem as ``load_task`` takes it (``-``: source text from standard input), or an
    error line when the file is missing."""
    if problem == "-":
        return sys.stdin.read(), None
    if not Path(problem).is_file():
        what = "is a directory" if Path(problem).is_dir() else "does not exist"
        return problem, (
            f"cannot load the problem: {problem} {what}. Fix: check the path, or pipe the "
            "problem's source into `stitch-graph optimize -`."
        )
    return problem, None


def cmd_optimize(args: argparse.Namespace) -> int:
    """Run (or resume) the loop on one problem (``-``: its source from standard input)."""
    from rich.console import Console

    from stitch_graph.graph import create_stitch_graph
    from stitch_graph.graph.checkpoint import sqlite_checkpointer
    from stitch_graph.task import TaskLoadError, load_task

    console = Console(stderr=True, highlight=False)
    run_id = None
    if args.resume:
        out = _run_folder(args.resume)
        meta_path = out / "run.json"
        if not meta_path.exists():
            console.print(
                f"[red]no run to resume at {escape(str(out))}[/red]: expected {meta_path}; "
                "give the run folder the run printed (--resume PATH) or a run id under runs/"
            )
            return 2
        meta = json.loads(meta_path.read_text())
        problem = meta["problem"]
        run_id = meta.get("run_id", out.name)
        defaults = vars(build_parser().parse_args(["optimize"]))
        for key, value in meta["args"].items():
            if key != "resume" and getattr(args, key, None) == defaults.get(key):
                setattr(args, key, value)
        graph = create_stitch_graph(checkpointer=sqlite_checkpointer(out / "checkpoints.sqlite"))
        snapshot = graph.get_state({"configurable": {"thread_id": run_id}})
        report = snapshot.values.get("report")
        if not snapshot.next and report is not None:
            _write_outputs(out, snapshot.values)
            print(f"run {run_id} already finished, nothing to resume: {report.summary}")
            print(f"outputs: {out.resolve()}")
            return 0
    else:
        if not args.problem:
            console.print("[red]optimize needs PROBLEM.py[/red] (or --resume RUN_ID)")
            return 2
        problem = args.problem
        stem = "problem" if problem == "-" else Path(problem).stem
        out = Path(args.out) if args.out else RUNS_DIR / (stem + time.strftime("-%Y%m%d-%H%M%S"))
        if (out / "checkpoints.sqlite").exists():
            console.print(
                f"[red]{escape(str(out))} already holds a run[/red]: continue it with "
                f"{escape(_resume_command(out))}, or choose another --out"
            )
            return 2
    source, missing = _read_problem(problem)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    try:
        task = load_task(source, name="problem" if problem == "-" else None)
    except TaskLoadError as exc:
        console.print(f"[red]cannot load the problem[/red]: {escape(str(exc))}")
        return 2
    try:
        ctx = context_from_args(args, out)
    except ValueError as exc:
        console.print(f"[red]{escape(str(exc))}[/red]")
        return 2
    bad_model = check_models(ctx, args)
    if bad_model:
        print(bad_model, file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        run_id = out.name
        if problem == "-":
            (out / "problem.py").write_text(source)
            problem = str(out / "problem.py")
        saved = {
            k: v
            for k, v in vars(args).items()
            if isinstance(v, (str, int, float, bool, type(None)))
        }
        saved.pop("func", None)
        meta = {"problem": str(Path(problem).resolve()), "run_id": run_id, "args": saved}
        (out / "run.json").write_text(json.dumps(meta, indent=1))
    graph = create_stitch_graph(checkpointer=sqlite_checkpointer(out / "checkpoints.sqlite"))
    config = {"configurable": {"thread_id": run_id}, "recursion_limit": 500}
    snapshot = graph.get_state(config)
    inputs = (
        None if args.resume and snapshot.values else {"task": task, "problem_path": str(problem)}
    )
    resume = _resume_command(out)
    console.print(f"run [bold]{escape(run_id)}[/bold] -> {escape(str(out))}")
    console.print(f"resume with: {escape(resume)}", soft_wrap=True)
    try:
        with (out / "log.jsonl").open("a") as log, console.status("working") as status:
            for mode, chunk in graph.stream(
                inputs, config, context=ctx, stream_mode=["updates", "custom"]
            ):
                if mode == "custom":
                    log.write(json.dumps(chunk, default=str) + "\n")
                    log.flush()
                    if not args.quiet:
                        console.print(_describe(chunk), markup=True)
                    status.update(f"{chunk.get('agent')}: {chunk.get('event')}")
                else:
                    log.write(json.dumps({"update": list(chunk)}, default=str) + "\n")
    except KeyboardInterrupt:
        print(f"interrupted: resume with {resume}", file=sys.stderr)
        return 130
    final = graph.get_state(config).values
    _write_outputs(out, final)
    report = final.get("report")
    print(report.summary if report else "run ended without a report")
    print(f"outputs: {out.resolve()}")
    ended_without_program = ("failed", "no_program", "unsupported")
    return 0 if report is not None and report.outcome not in ended_without_program else 1


def cmd_graph(args: argparse.Namespace) -> int:
    """Print or write the drawing of the graph."""
    from stitch_graph.graph import create_stitch_graph
    from stitch_graph.graph.drawing import draw

    if args.format in ("png", "svg") and not args.output:
        print(f"--format {args.format} writes an image: give --output FILE", file=sys.stderr)
        return 2
    try:
        result = draw(create_stitch_graph(), args.format, path=args.output)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.output:
        print(f"wrote {args.output}")
    elif isinstance(result, str):
        print(result)
    return 0


def cmd_knowledge(args: argparse.Namespace) -> int:
    """Add documents to the knowledge index, or search it."""
    from stitch_graph.cli.knowledge import cmd_add, cmd_search

    if args.knowledge_command == "add":
        return cmd_add(args.paths)
    return cmd_search(args.query, args.k, args.mode)


def cmd_export_training(args: argparse.Namespace) -> int:
    """Write training samples (write-from-task, improve-from-feedback) from finished runs."""
    from stitch_graph.graph import create_stitch_graph
    from stitch_graph.graph.checkpoint import sqlite_checkpointer
    from stitch_graph.reward import export_training_data
    from stitch_graph.reward.from_run import samples_from_run

    samples = []
    for run in args.runs:
        folder = Path(run) if Path(run).is_dir() else RUNS_DIR / run
        db = folder / "checkpoints.sqlite"
        if not db.exists():
            print(f"{folder}: no checkpoints.sqlite; is this a run folder?", file=sys.stderr)
            return 2
        graph = create_stitch_graph(checkpointer=sqlite_checkpointer(db))
        samples += samples_from_run(graph, {"configurable": {"thread_id": folder.name}})
    report = export_training_data(samples, args.out, include_hacks=not args.no_hacks)
    for skill, count in report.counts.items():
        print(f"{skill}: {count} samples -> {report.files[skill]}")
    return 0


def _version() -> str:
    from stitch_graph import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``stitch-graph``."""
    parser = argparse.ArgumentParser(
        prog="stitch-graph",
        description="Turn a PyTorch program (KernelBench format) into verified, faster CUDA "
        "with Planner, Coder and Verifier agents. Without --model the rule-based agents run.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    opt = sub.add_parser(
        "optimize", help="optimise one problem file", description=cmd_optimize.__doc__
    )
    opt.add_argument(
        "problem",
        nargs="?",
        help="KernelBench problem file (Model, get_inputs, ...); '-' reads its source from stdin",
    )
    add_model_options(opt)
    opt.add_argument("--out", help="run folder (default: runs/<problem>-<time>)")
    opt.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run from its last step: its folder (the run prints it), or a "
        "run id under runs/",
    )
    opt.add_argument("--max-rounds", type=int, default=12)
    opt.add_argument("--wall-time", type=float, default=1800.0, help="seconds")
    opt.add_argument(
        "--tune-budget", type=float, default=15.0, help="seconds of autotuning a run at most"
    )
    opt.add_argument("--arch", default="sm_90a", help="nvcc architecture (sm_90a: H100/H200)")
    opt.add_argument("--no-profile", action="store_true", help="skip ncu profiling")
    opt.add_argument("--no-knowledge", action="store_true", help="skip knowledge-index advice")
    opt.add_argument("--quiet", action="store_true", help="no per-event progress lines")
    opt.set_defaults(func=cmd_optimize)

    gr = sub.add_parser("graph", help="draw the agent graph (Mermaid, ASCII, PNG, SVG)")
    gr.add_argument("--format", default="mermaid", choices=["mermaid", "ascii", "png", "svg"])
    gr.add_argument("--output", help="write to this file instead of printing")
    gr.set_defaults(func=cmd_graph)

    ex = sub.add_parser(
        "export-training", help="training samples for the Coder's two skills from finished runs"
    )
    ex.add_argument("runs", nargs="+", help="run folders or run ids under runs/")
    ex.add_argument("--out", required=True, help="folder for the JSONL files")
    ex.add_argument("--no-hacks", action="store_true", help="leave out samples rejected as hacks")
    ex.set_defaults(func=cmd_export_training)

    kn = sub.add_parser("knowledge", help="the CUDA knowledge index")
    ksub = kn.add_subparsers(dest="knowledge_command", required=True)
    add = ksub.add_parser(
        "add",
        help="add Markdown, HTML, text (or PDF) documents",
        description="Add documents to the knowledge index. Their chunks are stored in "
        "$STITCH_CACHE_DIR/knowledge/documents.jsonl (default: "
        "~/.cache/stitch-graph/knowledge/documents.jsonl), next to the cached index; set "
        "STITCH_CACHE_DIR to keep them elsewhere (search reads the same place).",
    )
    add.add_argument("paths", nargs="+")
    search = ksub.add_parser("search", help="print ranked hits for a query")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--mode", default="hybrid", choices=["hybrid", "dense", "keyword"])
    kn.set_defaults(func=cmd_knowledge)

    from stitch_graph.cli import bench, export_data, verify

    verify.add_parser(sub)
    export_data.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stitch-graph`` command."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # a run in progress says how to resume; this is before or after it
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
