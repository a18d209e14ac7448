"""llmnote.compile_stages: ahead-of-time compilation for sm_90 on any machine, every stage kept."""

import ast

import pytest

import llmnote  # noqa: F401  (first: chooses the device before triton is imported)
from llmnote.compile_stages import STAGES, _check_self_contained, compile_stages
from llmnote.kernels.elementwise import add_kernel
from llmnote.kernels.gemm.matmul import matmul_kernel
from llmnote.show import source_of

ADD_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}

DOT_SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "BLOCK": "constexpr"}
DOT_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + r[:, None] * BLOCK + r[None, :])
    b = tl.load(b_ptr + r[:, None] * BLOCK + r[None, :])
    tl.store(c_ptr + r[:, None] * BLOCK + r[None, :], tl.dot(a, b).to(tl.float16))
"""


@pytest.fixture(scope="module")
def add_stages():
    return compile_stages(add_kernel, ADD_SIGNATURE, {"BLOCK": 1024}, aligned=["x_ptr", "y_ptr", "out_ptr", "n"])


def test_every_stage_of_vector_add(add_stages):
    s = add_stages
    assert all(s.stage(name) for name in STAGES)
    assert "tt.load" in s.ttir and "#ttg" not in s.ttir  # Triton IR has no layouts yet
    assert "#ttg.blocked" in s.ttgir and "sizePerThread = [4]" in s.ttgir  # 4 fp32 = 16 bytes per thread
    assert "ld.global.v4" in s.ptx and ".target sm_90" in s.ptx
    assert "LDG.E.128" in s.sass and "STG.E.128" in s.sass
    assert s.cubin[:4] == b"\x7fELF"
    assert s.metadata["num_warps"] == 4 and s.metadata["shared"] == 0
    assert 0 < s.resources["REG"] <= 255 and s.resources["LOCAL"] == 0
    assert s.count("ptx", r"ld\.global\.v4") == 4 and "ld.global.v4" in s.excerpt("ptx", r"ld\.global")


def test_alignment_hint_decides_vectorisation(add_stages):
    unaligned = compile_stages(add_kernel, ADD_SIGNATURE, {"BLOCK": 1024}, aligned=[])
    assert "ld.global.v4" not in unaligned.ptx and "ld.global.b32" in unaligned.ptx
    assert "ld.global.v4" in add_stages.ptx


def test_results_are_cached(add_stages):
    again = compile_stages(add_kernel, ADD_SIGNATURE, {"BLOCK": 1024}, aligned=["x_ptr", "y_ptr", "out_ptr", "n"])
    assert again is add_stages


def test_tl_dot_becomes_wgmma_on_hopper():
    s = compile_stages(DOT_SOURCE, DOT_SIGNATURE, {"BLOCK": 64}, name="dot_kernel")
    assert "#ttg.nvidia_mma<{versionMajor = 3" in s.ttgir
    assert "wgmma.mma_async" in s.ptx and "HGMMA" in s.sass
    ampere = compile_stages(DOT_SOURCE, DOT_SIGNATURE, {"BLOCK": 64}, name="dot_kernel", arch=80)
    assert "wgmma" not in ampere.ptx and "mma.sync" in ampere.ptx and "HMMA" in ampere.sass


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="signature"):
        compile_stages(add_kernel, {"x_ptr": "*fp32"}, {"BLOCK": 1024})
    with pytest.raises(ValueError, match="constexpr"):
        compile_stages(add_kernel, ADD_SIGNATURE, {})
    with pytest.raises(ValueError, match="signature"):
        compile_stages(add_kernel, {**ADD_SIGNATURE, "n": "int"}, {"BLOCK": 1024})
    with pytest.raises(ValueError, match="arch"):
        compile_stages(add_kernel, ADD_SIGNATURE, {"BLOCK": 1024}, arch=91)
    with pytest.raises(ValueError, match="num_warps"):
        compile_stages(add_kernel, ADD_SIGNATURE, {"BLOCK": 1024}, num_warps=3)
    with pytest.raises(ValueError, match="name"):
        compile_stages(DOT_SOURCE, {}, {})
    with pytest.raises(ValueError, match="aligned"):
        compile_stages(add_kernel, ADD_SIGNATURE, {"BLOCK": 1024}, aligned=["BLOCK"])
    with pytest.raises(TypeError, match="kernel"):
        compile_stages(42, ADD_SIGNATURE, {"BLOCK": 1024})


def test_kernel_using_module_globals_is_refused():
    # matmul_kernel uses only its arguments, tl and builtins; a kernel that reads a module constant does not.
    _check_self_contained(ast.parse(source_of(matmul_kernel)).body[0])
    func = ast.parse("def k(x_ptr):\n    return x_ptr + OFFSET\n").body[0]
    with pytest.raises(ValueError, match="OFFSET"):
        _check_self_contained(func)


def test_timeout_is_reported():
    with pytest.raises(TimeoutError):
        compile_stages(DOT_SOURCE, DOT_SIGNATURE, {"BLOCK": 32}, name="dot_kernel", timeout_s=0.01)
