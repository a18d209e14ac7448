"""Compile a Triton kernel ahead of time for an NVIDIA GPU and keep every stage it passes through.

Triton lowers a ``@triton.jit`` function step by step: Python AST -> Triton IR (``ttir``)
-> TritonGPU IR (``ttgir``: layouts, warps, pipelining) -> LLVM IR (``llir``) -> PTX ->
a ``cubin`` of SASS machine code (assembled by ``ptxas``). :func:`compile_stages` runs that
pipeline for a chosen architecture (default ``sm_90``, Hopper) and returns the text of
every stage, the SASS disassembly and the resources the kernel needs.

No GPU is needed: compilation is pure code generation, and the Triton wheel ships
``ptxas``, ``cuobjdump`` and ``nvdisasm``. The work happens in a subprocess whose
environment has no ``TRITON_INTERPRET``, because ``import llmnote`` puts this process's
Triton into its interpreter on a CPU-only machine, and Triton cannot switch modes once it
is imported. Results are cached per process (same inputs, same answer).

Example::

    stages = compile_stages(kernels.elementwise.add_kernel,
                            {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                            {"BLOCK": 1024})
    print(stages.excerpt("ptx", "ld.global"))
"""

from __future__ import annotations

import ast
import base64
import builtins
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CompiledStages", "compile_stages", "STAGES", "WORKER_SCRIPT", "triton_tools_dir"]

STAGES = ("ttir", "ttgir", "llir", "ptx", "sass")
_ARCHES = (80, 86, 89, 90, 100, 120)
_SCALAR_TYPES = {"i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64"}
_CACHE: dict[str, CompiledStages] = {}

# Runs in the subprocess: compile, dump the stages and the resource usage, write JSON.
WORKER_SCRIPT = r"""
import base64, importlib.util, json, os, subprocess, sys
job = json.load(open(sys.argv[1]))
import triton
from triton.backends.compiler import GPUTarget

spec = importlib.util.spec_from_file_location("llmnote_compile_stages_kernel", job["module"])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, job["name"])
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in job["aligned"]}
options = {"num_warps": job["num_warps"], "num_stages": job["num_stages"]}
if getattr(fn, "is_gluon", lambda: False)():  # a @gluon.jit kernel
    from triton.experimental.gluon._runtime import GluonASTSource as Source
else:
    Source = triton.compiler.ASTSource
if job["maxnreg"] is not None:
    options["maxnreg"] = job["maxnreg"]
src = Source(fn=fn, signature=job["signature"], constexprs=job["constexprs"], attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", job["arch"], 32), options=options)
out = {s: k.asm[s] if s in k.asm else "" for s in ("ttir", "ttgir", "llir", "ptx")}  # Gluon starts at ttgir
out["cubin"] = base64.b64encode(k.asm["cubin"]).decode()
meta = k.metadata._asdict()
out["metadata"] = {key: meta[key] for key in ("name", "arch", "num_warps", "num_stages", "num_ctas", "shared") if key in meta}
tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
cubin_path = os.path.join(os.path.dirname(job["module"]), "kernel.cubin")
with open(cubin_path, "wb") as f:
    f.write(k.asm["cubin"])
cuobjdump = os.path.join(tools, "cuobjdump")
out["sass"] = out["resources"] = None
if os.access(cuobjdump, os.X_OK):
    out["sass"] = subprocess.run([cuobjdump, "-sass", cubin_path], capture_output=True, text=True, check=True).stdout
    out["resources"] = subprocess.run([cuobjdump, "-res-usage", cubin_path], capture_output=True, text=True, check=True).stdout
out["triton"] = triton.__version__
with open(job["result"], "w") as f:
    json.dump(out, f)
"""


@dataclass(frozen=True)
class CompiledStages:
    """Every stage of one compiled kernel (text), the cubin (bytes) and what it needs to run.

    A Gluon kernel is written at the TTGIR level, so its ``ttir`` is empty.
    ``metadata`` is Triton's: ``shared`` is the dynamic shared memory per program in bytes,
    ``num_warps`` and ``num_stages`` the launch options. ``resources`` is parsed from
    ``cuobjdump -res-usage``: ``REG`` (registers per thread), ``STACK``, ``SHARED`` (static
    shared memory only), ``LOCAL`` (spills) in bytes; empty when the tools are missing.
    """

    name: str
    arch: int
    ttir: str
    ttgir: str
    llir: str
    ptx: str
    sass: str | None
    cubin: bytes = field(repr=False)
    metadata: dict
    resources: dict
    triton_version: str

    def stage(self, stage: str) -> str:
        """The full text of one of :data:`STAGES`, debug information included."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        text = getattr(self, stage)
        if text is None:
            raise RuntimeError("no SASS: cuobjdump was not found next to ptxas in the Triton wheel")
        return text

    def text(self, stage: str) -> str:
        """One stage without its debug information, for reading: no MLIR ``loc(...)``
        annotations, no LLVM ``!dbg`` metadata, no PTX ``.loc``/DWARF sections, no SASS
        instruction encodings."""
        return _strip_debug(stage, self.stage(stage))

    def count(self, stage: str, pattern: str) -> int:
        """How many lines of ``text(stage)`` match the regular expression ``pattern``."""
        rx = re.compile(pattern)
        return sum(1 for line in self.text(stage).splitlines() if rx.search(line))

    def excerpt(self, stage: str, pattern: str, context: int = 0, max_matches: int = 6, width: int = 160) -> str:
        """Lines of ``text(stage)`` that match ``pattern`` (with ``context`` lines around
        each), numbered, cut to ``width`` characters; ``...`` marks skipped lines."""
        lines = self.text(stage).splitlines()
        rx = re.compile(pattern)
        hits = [i for i, line in enumerate(lines) if rx.search(line)][:max_matches]
        keep = sorted({j for i in hits for j in range(max(0, i - context), min(len(lines), i + context + 1))})
        out, last = [], -1
        for j in keep:
            if last >= 0 and j != last + 1:
                out.append("   ...")
            line = lines[j].rstrip()
            out.append(f"{j + 1:5d}  {line if len(line) <= width else line[: width - 3] + '...'}")
            last = j
        return "\n".join(out)

    def sizes(self) -> dict[str, int]:
        """Lines per stage (without debug information), and bytes of the cubin."""
        sizes = {s: len(self.text(s).splitlines()) for s in STAGES if getattr(self, s) is not None}
        sizes["cubin bytes"] = len(self.cubin)
        return sizes


_MLIR_LOC = re.compile(r"\s*loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")
_SASS_ENCODING = re.compile(r"\s*/\* 0x[0-9a-f]+ \*/\s*$")


def _strip_debug(stage: str, text: str) -> str:
    lines = text.splitlines()
    if stage in ("ttir", "ttgir"):
        lines = [_MLIR_LOC.sub("", line) for line in lines if not line.startswith("#loc")]
    elif stage == "llir":
        lines = [re.sub(r",? !dbg !\d+", "", line) for line in lines if not line.startswith("!")]
    elif stage == "ptx":
        end = next((i for i, line in enumerate(lines) if re.match(r"\s*\.section\s+\.debug", line)), len(lines))
        lines = [line for line in lines[:end] if not re.match(r"\s*\.(loc|file)\s", line)]
    elif stage == "sass":
        lines = [_SASS_ENCODING.sub("", line) for line in lines if not re.fullmatch(r"\s*/\* 0x[0-9a-f]+ \*/\s*", line)]
    return "\n".join(lines)


def triton_tools_dir() -> Path:
    """The folder of ``ptxas``/``cuobjdump``/``nvdisasm`` inside the installed Triton wheel."""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        raise RuntimeError("triton is not installed")
    return Path(spec.origin).parent / "backends" / "nvidia" / "bin"


def _kernel_source(kernel: object, name: str | None) -> tuple[str, str]:
    """(module source, function name) for a jitted kernel or a source string."""
    if isinstance(kernel, str):
        if not name:
            raise ValueError("name is required when kernel is source code: the name of the @triton.jit function in it")
        return textwrap.dedent(kernel), name
    from .show import source_of

    fn = getattr(kernel, "fn", kernel)
    if not callable(fn) or not hasattr(fn, "__name__"):
        raise TypeError(f"kernel must be a @triton.jit function or its source code as a str, got {type(kernel).__name__}")
    if name is not None and name != fn.__name__:
        raise ValueError(f"name {name!r} does not match the kernel's name {fn.__name__!r}")
    tree = ast.parse(source_of(kernel))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    func.decorator_list = []
    _check_self_contained(func)
    body = ast.unparse(func)
    return f"import triton\nimport triton.language as tl\n\n\n@triton.jit\n{body}\n", fn.__name__


def _check_self_contained(func: ast.FunctionDef) -> None:
    """A kernel passed as a function may use only its arguments, its locals, builtins, ``tl`` and ``triton``."""
    args = {a.arg for a in func.args.args + func.args.kwonlyargs}
    stored = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loaded = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    missing = sorted(loaded - args - stored - set(dir(builtins)) - {"tl", "triton"})
    if missing:
        raise ValueError(
            f"kernel {func.name} uses module-level names {missing}; pass its source as a str (with those names defined)"
        )


def _check_signature(source: str, name: str, signature: dict, constexprs: dict, aligned: list[str]) -> None:
    tree = ast.parse(source)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if func is None:
        raise ValueError(f"no function named {name!r} in the kernel source")
    params = [a.arg for a in func.args.args]
    if not isinstance(signature, dict) or list(signature) != params:
        got = list(signature) if isinstance(signature, dict) else type(signature).__name__
        raise ValueError(f"signature must be a dict with one entry per parameter, in order: {params}; got {got}")
    for arg, ty in signature.items():
        ok = isinstance(ty, str) and (ty == "constexpr" or (ty.lstrip("*") in _SCALAR_TYPES and ty.count("*") <= 1))
        descriptor = isinstance(ty, str) and re.fullmatch(r"tensordesc<(\w+)\[\d+(,\d+)*\](,NVMMASharedLayout\(.*\))?>", ty)
        if not (ok or (descriptor and descriptor.group(1) in _SCALAR_TYPES)):
            raise ValueError(
                f"signature[{arg!r}] must be 'constexpr', a scalar type {sorted(_SCALAR_TYPES)}, '*' + one, "
                f"or a TMA descriptor such as 'tensordesc<bf16[64,128]>' (Gluon: followed by ',' and the repr of its "
                f"NVMMASharedLayout); got {ty!r}"
            )
    wanted = sorted(a for a, ty in signature.items() if ty == "constexpr")
    if sorted(constexprs) != wanted:
        raise ValueError(f"constexprs must give a value for exactly the constexpr parameters {wanted}, got {sorted(constexprs)}")
    for arg in aligned:
        if arg not in signature or signature[arg] == "constexpr" or signature[arg] in ("fp16", "bf16", "fp32", "fp64"):
            raise ValueError(f"aligned names pointer or integer parameters; {arg!r} is not one")


def compile_stages(
    kernel: object,
    signature: dict[str, str],
    constexprs: dict[str, object] | None = None,
    *,
    name: str | None = None,
    aligned: Iterable[str] | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    arch: int = 90,
    maxnreg: int | None = None,
    timeout_s: float = 180.0,
) -> CompiledStages:
    """Compile ``kernel`` for ``sm_<arch>`` without a GPU and return all of its stages.

    ``kernel``: a ``@triton.jit`` function whose body uses only its arguments, ``tl`` and
    builtins (for instance ``llmnote.kernels.gemm.matmul.matmul_kernel``), or module source code
    as a ``str`` together with ``name``, the function to compile (``@triton.jit`` or
    ``@gluon.jit``; the module may import only installed packages, not relative ones).
    ``signature``: every parameter, in order, mapped to ``"*fp16"``-style pointer types,
    scalar types (``"i32"``, ``"fp32"``, ...), tensor descriptors (``"tensordesc<bf16[64,128]>"``:
    element type and block shape, for kernels that load through the TMA) or ``"constexpr"``; ``constexprs`` gives the
    constexpr values. ``aligned``: parameters promised to be multiples of 16 (pointers
    aligned to 16 bytes, integers divisible by 16), as Triton's launcher specialises them at
    run time; by default every pointer, which is what a launch with fresh PyTorch tensors
    gets. ``num_warps``/``num_stages`` are the launch options an autotuning config sets;
    ``maxnreg`` caps registers per thread (warp-specialised kernels share it out).
    Raises ``TimeoutError`` after ``timeout_s`` seconds and ``RuntimeError`` if Triton fails.
    """
    source, fn_name = _kernel_source(kernel, name)
    constexprs = dict(constexprs or {})
    aligned = [a for a, ty in signature.items() if ty.startswith("*")] if aligned is None else list(aligned)
    _check_signature(source, fn_name, signature, constexprs, aligned)
    if arch not in _ARCHES:
        raise ValueError(f"arch must be one of {_ARCHES} (compute capability x 10), got {arch!r}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an integer >= 1, got {num_stages!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    job = dict(
        name=fn_name,
        signature=signature,
        constexprs=constexprs,
        aligned=aligned,
        num_warps=num_warps,
        num_stages=num_stages,
        arch=arch,
        maxnreg=maxnreg,
    )
    key = json.dumps([source, job], sort_keys=True, default=repr)
    if key not in _CACHE:
        _CACHE[key] = _compile_in_subprocess(source, job, timeout_s)
    return _CACHE[key]


def _compile_in_subprocess(source: str, job: dict, timeout_s: float) -> CompiledStages:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="llmnote-compile-") as tmp:
        module, result = Path(tmp) / "kernel_source.py", Path(tmp) / "result.json"
        module.write_text(source)
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps({**job, "module": str(module), "result": str(result)}))
        try:
            proc = subprocess.run(
                [sys.executable, "-c", WORKER_SCRIPT, str(job_file)], env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"compiling {job['name']} for sm_{job['arch']} took longer than {timeout_s} s") from None
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"compiling {job['name']} for sm_{job['arch']} failed:\n{proc.stderr[-4000:]}")
        out = json.loads(result.read_text())
    return CompiledStages(
        name=job["name"],
        arch=job["arch"],
        ttir=out["ttir"],
        ttgir=out["ttgir"],
        llir=out["llir"],
        ptx=out["ptx"],
        sass=out["sass"],
        cubin=base64.b64decode(out["cubin"]),
        metadata=out["metadata"],
        resources=_parse_resources(out["resources"] or "", job["name"]),
        triton_version=out["triton"],
    )


def _parse_resources(text: str, name: str) -> dict[str, int]:
    """``REG:40 STACK:0 SHARED:0 LOCAL:0 ...`` of the kernel's function in ``cuobjdump -res-usage``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("Function") and name in line and i + 1 < len(lines):
            return {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", lines[i + 1])}
    return {}
