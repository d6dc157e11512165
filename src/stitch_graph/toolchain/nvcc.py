"""Compile candidate CUDA with nvcc and turn its output into structured feedback.

The Verifier needs three things from a build: whether it worked, *where* it failed (so the Coder
can fix the right line) and what ptxas says about each kernel's resources (registers, spills,
shared memory), which decides occupancy long before anything runs. nvcc prints all of that as
free text; this module runs nvcc in a content-addressed build folder, so an unchanged candidate is
never compiled twice, and parses the text into :class:`~stitch_graph.artifacts.Diagnostic` and
:class:`~stitch_graph.artifacts.KernelResources`. It never raises for a failed build: a compiler
error, a missing nvcc and a timeout all come back as ``CompileResult(ok=False)`` with a message
that says what to do.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from stitch_graph.artifacts import CompileResult, Diagnostic, KernelResources
from stitch_graph.toolchain.locate import find_cuda_tool
from stitch_graph.toolchain.process import run_tool

__all__ = [
    "HOST_FILE",
    "KERNEL_FILE",
    "find_nvcc",
    "nvcc_compile",
    "nvcc_compile_parts",
    "nvcc_version",
    "parse_diagnostics",
    "parse_ptxas_resources",
]

KERNEL_FILE = "kernel.cu"
"""Name of the CUDA translation unit inside a build folder."""
HOST_FILE = "host.cpp"
"""Name of the optional host C++ file inside a build folder."""

_CUBIN = "kernel.cubin"
_SHARED = "libcandidate.so"
_LOG = "build.log"
_META = "build.json"
_CACHE_FORMAT = "1"  # bump when the command line or the folder layout changes

_INSTALL_HINT = (
    "Install the CUDA toolkit and put nvcc on PATH, or set STITCH_NVCC to the nvcc executable."
)


# --------------------------------------------------------------------------------------------
# Finding nvcc


def find_nvcc() -> str | None:
    """Locate the nvcc executable.

    Looks at ``$STITCH_NVCC`` first; when that is set it is the only candidate (a wrong explicit
    setting is reported rather than silently replaced). Otherwise ``nvcc`` on ``PATH``, then
    ``$CUDA_HOME/bin/nvcc`` and ``/usr/local/cuda/bin/nvcc``.

    Returns:
        The path of an executable nvcc, or ``None`` when there is none.
    """
    return find_cuda_tool("nvcc")


def nvcc_version(nvcc: str | None = None) -> str | None:
    """Version of nvcc, e.g. ``"13.0.88"``.

    Args:
        nvcc: Path of the executable; found with :func:`find_nvcc` when omitted.

    Returns:
        The full version (``V13.0.88`` without the ``V``), the release (``13.0``) when only that
        is printed, or ``None`` when nvcc is missing or does not answer.
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return None
    try:
        mtime = os.stat(nvcc).st_mtime_ns
    except OSError:
        return None
    return _nvcc_version_cached(nvcc, mtime)


@functools.lru_cache(maxsize=8)
def _nvcc_version_cached(nvcc: str, mtime: int) -> str | None:
    del mtime  # part of the cache key only: a reinstalled nvcc is asked again
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if m := re.search(r"\bV(\d+(?:\.\d+)+)", out):
        return m.group(1)
    if m := re.search(r"release (\d+(?:\.\d+)*)", out):
        return m.group(1)
    return None


# --------------------------------------------------------------------------------------------
# Compiling


def nvcc_compile(
    source: str,
    *,
    arch: str = "sm_90a",
    mode: Literal["cubin", "shared"] = "cubin",
    host_cpp: str | None = None,
    link_libraries: Sequence[str] = (),
    extra_flags: Sequence[str] = (),
    work_dir: str | Path | None = None,
    timeout_s: float = 120.0,
) -> CompileResult:
    """Compile CUDA source with nvcc into a cubin or a shared library.

    The build folder is ``<work_dir>/<hash>``, the hash covering the sources, arch, mode, flags,
    libraries and nvcc version. If that folder already holds the artefact, nothing is compiled:
    the stored log is parsed again and the result comes back with ``cached=True``.

    Mode ``"cubin"`` runs ``nvcc -cubin -arch=<arch> -std=c++17 -O3 -lineinfo -Xptxas -v``.
    Mode ``"shared"`` builds ``libcandidate.so`` from ``kernel.cu`` (and ``host.cpp`` when
    ``host_cpp`` is given) with ``-shared -Xcompiler -fPIC`` and ``-Xlinker --no-undefined``, so a
    missing symbol is a build error rather than a failure when the library is loaded.

    Args:
        source: The CUDA C++ translation unit (written as ``kernel.cu``).
        arch: Target, e.g. ``sm_90a``.
        mode: ``"cubin"`` for a loadable module, ``"shared"`` for a host-callable library.
        host_cpp: Optional host C++ source (``host.cpp``), shared mode only.
        link_libraries: Libraries to link in shared mode, e.g. ``["cublas"]`` (``-lcublas``).
        extra_flags: Further nvcc flags, e.g. ``["-maxrregcount=32"]``.
        work_dir: Root of the build folders; defaults to ``$STITCH_CACHE_DIR/builds`` or
            ``~/.cache/stitch-graph/builds``.
        timeout_s: Wall-clock limit of the nvcc run.

    Returns:
        The build outcome. ``ok=False`` carries at least one error diagnostic.

    Raises:
        ValueError: For arguments that cannot describe a build (unknown mode, host code or
            libraries with a cubin, a malformed library name).
    """
    if mode not in ("cubin", "shared"):
        msg = f"mode must be 'cubin' or 'shared', not {mode!r}"
        raise ValueError(msg)
    if mode == "cubin" and (host_cpp is not None or link_libraries):
        msg = "host_cpp and link_libraries need mode='shared'; a cubin holds device code only"
        raise ValueError(msg)
    libs = [_library_name(lib) for lib in link_libraries]
    flags = [str(f) for f in extra_flags]
    command = _command(arch, mode, host_cpp is not None, libs, flags)

    nvcc = find_nvcc()
    if nvcc is None:
        explicit = os.environ.get("STITCH_NVCC")
        where = (
            f"STITCH_NVCC={explicit!r} is not an executable file"
            if explicit
            else "nvcc is not on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin"
        )
        return _failure(arch, ["nvcc", *command], f"nvcc not found: {where}. {_INSTALL_HINT}")
    command = [nvcc, *command]
    version = nvcc_version(nvcc)

    root = Path(work_dir) if work_dir is not None else _default_work_dir()
    key = _build_key(source, host_cpp, arch, mode, flags, libs, version)
    final = root / key
    artifact_name = _CUBIN if mode == "cubin" else _SHARED

    start = time.perf_counter()
    if (final / artifact_name).is_file() and (final / _LOG).is_file():
        cached = _load_cached(final, artifact_name, arch, command, start)
        if cached is not None:
            return cached

    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{key}.{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    (staging / KERNEL_FILE).write_text(source)
    if host_cpp is not None:
        (staging / HOST_FILE).write_text(host_cpp)

    returncode, raw_log, problem = _run(command, staging, timeout_s)
    seconds = time.perf_counter() - start
    log = _sanitize(raw_log, (staging, final))
    (staging / _LOG).write_text(log)
    meta = {
        "format": _CACHE_FORMAT,
        "command": command[1:],
        "returncode": returncode,
        "seconds": seconds,
        "arch": arch,
        "mode": mode,
        "nvcc_version": version,
    }
    (staging / _META).write_text(json.dumps(meta, indent=1))
    ok = problem is None and returncode == 0 and (staging / artifact_name).is_file()
    folder = _publish(staging, final, artifact_name)

    diagnostics = parse_diagnostics(log)
    if problem is not None:
        diagnostics.append(Diagnostic(severity="error", message=problem))
    elif not ok and not any(d.severity == "error" for d in diagnostics):
        tail = "\n".join(log.strip().splitlines()[-5:]) or "(no output)"
        diagnostics.append(
            Diagnostic(severity="error", message=f"nvcc exited with status {returncode}: {tail}")
        )
    return CompileResult(
        ok=ok,
        arch=arch,
        command=command,
        diagnostics=diagnostics,
        resources=parse_ptxas_resources(log),
        log=log,
        seconds=seconds,
        artifact=str(folder / artifact_name) if ok else None,
        cached=False,
    )


def nvcc_compile_parts(
    parts: Sequence[str],
    *,
    arch: str = "sm_90a",
    work_dir: str | Path | None = None,
    timeout_s: float = 300.0,
) -> CompileResult:
    """Compile the parts of one split kernel source into cubins at once, as one result.

    A whole model's hundred kernels take nvcc a minute on one core; split (``runtime.split``)
    they take about that over the cores. Each part is built and cached like ``nvcc_compile``'s
    cubin; the result joins their diagnostics, register reports and logs, takes the slowest
    part's seconds, and has no artifact: there is no one module to load, and the candidate's
    worker builds its own parts with NVRTC.

    Args:
        parts: The translation units (``#line`` directives keep diagnostics on the whole
            source's lines).
        arch: Target, e.g. ``sm_90a``.
        work_dir: Root of the build folders, as for ``nvcc_compile``.
        timeout_s: Each part's limit.

    Returns:
        ``ok`` when every part built.
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(len(parts), os.cpu_count() or 1))) as pool:
        results = list(
            pool.map(
                lambda part: nvcc_compile(part, arch=arch, work_dir=work_dir, timeout_s=timeout_s),
                parts,
            )
        )
    return CompileResult(
        ok=all(r.ok for r in results),
        arch=arch,
        command=results[0].command if results else [],
        diagnostics=[d for r in results for d in r.diagnostics],
        resources=[k for r in results for k in r.resources],
        log="\n".join(r.log for r in results),
        seconds=max((r.seconds for r in results), default=0.0),
        artifact=None,
        cached=all(r.cached for r in results),
    )


def _library_name(lib: str) -> str:
    name = lib[2:] if lib.startswith("-l") else lib
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*", name):
        msg = f"link library {lib!r} is not a library name such as 'cublas'"
        raise ValueError(msg)
    return name


def _command(
    arch: str, mode: str, has_host: bool, libs: Sequence[str], flags: Sequence[str]
) -> list[str]:
    common = [f"-arch={arch}", "-std=c++17", "-O3", "-lineinfo", "-Xptxas", "-v"]
    if mode == "cubin":
        return ["-cubin", *common, *flags, "-o", _CUBIN, KERNEL_FILE]
    sources = [KERNEL_FILE, HOST_FILE] if has_host else [KERNEL_FILE]
    return [
        "-shared",
        "-Xcompiler",
        "-fPIC",
        *common,
        "-Xlinker",
        "--no-undefined",
        *flags,
        "-o",
        _SHARED,
        *sources,
        *(f"-l{lib}" for lib in libs),
    ]


def _default_work_dir() -> Path:
    root = os.environ.get("STITCH_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "builds"
    return Path.home() / ".cache" / "stitch-graph" / "builds"


def _build_key(
    source: str,
    host_cpp: str | None,
    arch: str,
    mode: str,
    flags: Sequence[str],
    libs: Sequence[str],
    version: str | None,
) -> str:
    h = hashlib.sha256()
    parts = [_CACHE_FORMAT, source, host_cpp or "", arch, mode, "\x1f".join(flags)]
    parts += ["\x1f".join(libs), version or "unknown", "host" if host_cpp is not None else ""]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _run(command: list[str], cwd: Path, timeout_s: float) -> tuple[int | None, str, str | None]:
    """Run nvcc; return (exit status, merged output, problem that is not a compiler message)."""
    env = dict(os.environ, LC_ALL="C", LANG="C")  # plain ASCII quotes from gcc
    run = run_tool(command, cwd=cwd, env=env, timeout_s=timeout_s, merge_stderr=True)
    if run.start_error is not None:
        return None, "", f"could not start nvcc ({run.start_error}). {_INSTALL_HINT}"
    if run.timed_out:
        problem = (
            f"nvcc timed out after {timeout_s:g} s. The kernel may be too expensive to compile "
            "(deep unrolling, huge templates or local arrays); simplify it or raise timeout_s."
        )
        return run.returncode, run.stdout, problem
    return run.returncode, run.stdout, None


def _sanitize(log: str, folders: Iterable[Path]) -> str:
    """Remove the build folders' absolute paths from the log."""
    for folder in folders:
        for form in {str(folder), str(folder.resolve())}:
            log = log.replace(form + os.sep, "").replace(form, ".")
    return log


def _publish(staging: Path, final: Path, artifact_name: str) -> Path:
    """Move a finished staging folder to its keyed place; return where the build now lives."""
    if (final / artifact_name).is_file():  # another process won the race
        shutil.rmtree(staging, ignore_errors=True)
        return final
    if final.exists():  # an earlier failed build of the same inputs
        shutil.rmtree(final, ignore_errors=True)
    try:
        staging.rename(final)
    except OSError:
        if (final / artifact_name).is_file():
            shutil.rmtree(staging, ignore_errors=True)
            return final
        return staging
    return final


def _load_cached(
    folder: Path, artifact_name: str, arch: str, command: list[str], start: float
) -> CompileResult | None:
    try:
        log = (folder / _LOG).read_text()
        meta = json.loads((folder / _META).read_text())
    except (OSError, ValueError):
        return None
    if meta.get("returncode") != 0:
        return None
    return CompileResult(
        ok=True,
        arch=arch,
        command=command,
        diagnostics=parse_diagnostics(log),
        resources=parse_ptxas_resources(log),
        log=log,
        seconds=time.perf_counter() - start,
        artifact=str(folder / artifact_name),
        cached=True,
    )


def _failure(arch: str, command: list[str], message: str) -> CompileResult:
    return CompileResult(
        ok=False,
        arch=arch,
        command=command,
        diagnostics=[Diagnostic(severity="error", message=message)],
        log=message,
    )


# --------------------------------------------------------------------------------------------
# Parsing compiler messages

_SEVERITY: dict[str, Literal["error", "warning", "note", "info"]] = {
    "error": "error",
    "fatal": "error",
    "fatal error": "error",
    "catastrophic error": "error",
    "internal error": "error",
    "warning": "warning",
    "remark": "note",
    "note": "note",
    "info": "info",
}

# kernel.cu(12): error: identifier "x" is undefined
# kernel.cu(3): warning #177-D: variable "unused" was declared but never referenced
_FRONTEND = re.compile(
    r"^(?P<file>\S[^()]*?)\((?P<line>\d+)\): "
    r"(?P<sev>catastrophic error|internal error|error|warning|remark|note)"
    r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$"
)
# host.cpp:4:5: error: expected ';'   (gcc / clang)
_HOST = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? "
    r"(?P<sev>fatal error|error|warning|note): (?P<msg>.*)$"
)
# ptxas error   : Entry function 'k' uses too much shared data
# ptxas /tmp/tmpxft_..._kernel.ptx, line 12; error   : Unknown symbol 'x'
_PTXAS = re.compile(
    r"^ptxas(?: (?P<file>\S+), line (?P<line>\d+);)? ?(?P<sev>error|fatal|warning)\s*: (?P<msg>.*)$"
)
# nvcc fatal   : Unsupported gpu architecture 'sm_99'
_NVCC = re.compile(r"^nvcc (?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$")
# host.cpp:(.text+0x5): undefined reference to `missing_fn'
_LINK_REF = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?:\((?P<sect>[^)]*)\))?:? ?"
    r"(?P<msg>(?:undefined reference to|multiple definition of) .*)$"
)
# /usr/bin/ld: cannot find -lcublas: No such file or directory
_LD = re.compile(r"^(?:\S*/)?ld(?:\.\w+)?: (?P<msg>.*)$")
_MANGLED_QUOTED = re.compile(r"'(_Z\w+)'")
_COLLECT2 = re.compile(r"^collect2: (?:fatal )?error: (?P<msg>.*)$")
_TMP_OBJECT = re.compile(r"tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_(?P<stem>[\w.-]+?)\.(?:o|ptx|cudafe\w*)")
_STEM_TO_FILE = {"kernel": KERNEL_FILE, "host": HOST_FILE}


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """Parse nvcc, cudafe/cicc, ptxas, host-compiler and linker messages.

    Args:
        log: Combined stdout and stderr of an nvcc run.

    Returns:
        One diagnostic per message, in order. File names are as the compiler printed them for the
        sources (``kernel.cu``, ``host.cpp``); temporary objects are mapped back to their source.
        ``ptxas info`` lines are resource reports, not diagnostics, and are left out.
    """
    out: list[Diagnostic] = []
    link_summary: list[Diagnostic] = []
    for raw in log.splitlines():
        line = raw.rstrip()
        if not line or line[0].isspace():
            continue  # source excerpts, carets, ptxas property lines
        if m := _FRONTEND.match(line):
            msg = m["msg"].strip()
            if m["code"]:
                msg = f"{msg} [#{m['code']}]"
            out.append(
                Diagnostic(
                    file=_source_name(m["file"]),
                    line=int(m["line"]),
                    severity=_SEVERITY[m["sev"]],
                    message=msg,
                )
            )
        elif m := _HOST.match(line):
            out.append(
                Diagnostic(
                    file=_source_name(m["file"]),
                    line=int(m["line"]),
                    column=int(m["col"]) if m["col"] else None,
                    severity=_SEVERITY[m["sev"]],
                    message=m["msg"].strip(),
                )
            )
        elif m := _PTXAS.match(line):
            msg = m["msg"].strip()
            if m["line"]:
                msg = f"{msg} (PTX line {m['line']})"
            msg = _MANGLED_QUOTED.sub(lambda q: f"'{_demangle([q[1]])[0]}'", msg)
            out.append(Diagnostic(file="", severity=_SEVERITY[m["sev"]], message=f"ptxas: {msg}"))
        elif m := _NVCC.match(line):
            out.append(Diagnostic(severity=_SEVERITY[m["sev"]], message=f"nvcc: {m['msg']}"))
        elif m := _LINK_REF.match(line):
            out.append(Diagnostic(file=_source_name(m["file"]), message=m["msg"].strip()))
        elif m := _LD.match(line):
            msg = m["msg"].strip()
            if re.search(r"in function [`']", msg) or msg.endswith(":"):
                continue  # context for the next line
            out.append(Diagnostic(severity=_ld_severity(msg), message=f"ld: {msg}"))
        elif m := _COLLECT2.match(line):
            link_summary.append(Diagnostic(message=f"link failed: {m['msg'].strip()}"))
    if not any(d.severity == "error" for d in out):
        out.extend(link_summary)
    return out


def _ld_severity(msg: str) -> Literal["error", "warning"]:
    return "warning" if msg.startswith("warning") else "error"


def _source_name(name: str) -> str:
    """Map what the toolchain printed to the source file name a Coder knows."""
    name = name.strip()
    if m := _TMP_OBJECT.search(name):
        stem = m["stem"]
        return _STEM_TO_FILE.get(stem, stem)
    if os.path.isabs(name) and os.path.basename(name) in (KERNEL_FILE, HOST_FILE):
        return os.path.basename(name)
    if name.startswith("./"):
        return name[2:]
    return name


# --------------------------------------------------------------------------------------------
# Parsing ptxas resource reports

_ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '(?P<name>[^']+)' for '[^']*'")
_PROPS = re.compile(r"^ptxas info\s*: Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"^ptxas info\s*: Used (?P<rest>\d+ registers.*)$")


def parse_ptxas_resources(log: str, *, demangle: bool = True) -> list[KernelResources]:
    """Parse ``-Xptxas -v`` output into one :class:`KernelResources` per entry function.

    Understands ``Compiling entry function``, ``Function properties for`` followed by the
    ``stack frame / spill stores / spill loads`` line, and ``Used N registers, ...`` with any of
    ``smem``, ``cmem[i]`` (all banks summed), ``lmem`` and ``cumulative stack size``. Properties of
    non-entry device functions are ignored. A kernel reported twice keeps the last report.

    Args:
        log: nvcc output.
        demangle: Turn C++-mangled names into readable ones (``scale<float>(float*, float, int)``;
            the return type is dropped) with ``c++filt`` when it is available.

    Returns:
        Resources in the order ptxas compiled the kernels.
    """
    found: dict[str, KernelResources] = {}
    current: str | None = None
    props_target: str | None = None
    for raw in log.splitlines():
        line = raw.strip()
        if m := _ENTRY.match(line):
            current = m["name"]
            found.setdefault(current, KernelResources(kernel=current))
            props_target = None
        elif m := _PROPS.match(line):
            props_target = m["name"] if m["name"] in found else None
        elif (m := _FRAME.search(line)) and not line.startswith("ptxas"):
            if props_target is not None:
                res = found[props_target]
                res.stack_bytes = int(m["stack"])
                res.spill_stores_bytes = int(m["stores"])
                res.spill_loads_bytes = int(m["loads"])
            props_target = None
        elif (m := _USED.match(line)) and current is not None:
            _apply_usage(found[current], m["rest"])
    resources = list(found.values())
    if demangle:
        names = _demangle([r.kernel for r in resources])
        for res, name in zip(resources, names, strict=True):
            res.kernel = name
    return resources


def _apply_usage(res: KernelResources, text: str) -> None:
    constant = 0
    for part in text.split(","):
        part = part.strip()
        if m := re.fullmatch(r"(\d+) registers", part):
            res.registers = int(m[1])
        elif m := re.fullmatch(r"(\d+) bytes smem", part):
            res.shared_bytes = int(m[1])
        elif m := re.fullmatch(r"(\d+) bytes cmem\[\d+\]", part):
            constant += int(m[1])
        elif m := re.fullmatch(r"(\d+) bytes (?:cumulative stack size|lmem)", part):
            res.stack_bytes = max(res.stack_bytes, int(m[1]))
    res.constant_bytes = constant


def _demangle(names: list[str]) -> list[str]:
    mangled = [n for n in names if n.startswith("_Z")]
    if not mangled:
        return names
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return names
    try:
        out = subprocess.run(
            [tool],
            input="\n".join(mangled) + "\n",
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return names
    if len(out) != len(mangled):
        return names
    table = {m: _drop_return_type(d.strip()) or m for m, d in zip(mangled, out, strict=True)}
    return [table.get(n, n) for n in names]


def _drop_return_type(sig: str) -> str:
    return sig[5:] if sig.startswith("void ") else sig
