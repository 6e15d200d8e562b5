"""Ahead-of-time sm_90 compilation of Triton kernels for the aot_*.py scripts (no GPU needed), with the
resource check a GPU launch would report: ptxas registers and spill bytes.

Pointers get the 16-byte alignment the JIT specializes torch allocations with, so the code is the code a
launch would run (vectorized loads included)."""

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(fn, types, const, aligned=(), **options):
    """triton.compile for sm_90. types: name -> Triton type string (strides default to i64, other ints to
    i32); const: the constexpr arguments; aligned: integer arguments divisible by 16 (the JIT specializes
    those at launch, e.g. the strides of a contiguous cache with D = 128)."""
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else types.get(n, "i64" if n.startswith("stride") else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in aligned}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    return triton.compile(src, target=TARGET, options=options)


def ptxas_usage(kernel):
    """(registers, spill store bytes, spill load bytes): ptxas -v on the kernel's PTX."""
    ptx = kernel.asm["ptx"]
    arch = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M).group(1)
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # the ptxas this Triton compiles sm_90 with
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        r = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", os.devnull], capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    stores, loads = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out).groups())
    return regs, stores, loads


def check(kernel, what, vector_loads=False):
    """Fail on any spill; with vector_loads, require vectorized global loads in the PTX (16 bytes for 32-bit
    elements, 8 for 16-bit ones at 4 entries per thread)."""
    regs, stores, loads = ptxas_usage(kernel)
    assert stores == 0 and loads == 0, f"{what}: {regs} registers, spills {stores} B stored / {loads} B loaded"
    if vector_loads:
        assert re.search(r"ld\.global(\.\w+)*\.v[24]\.", kernel.asm["ptx"]), f"{what}: no vectorized loads"
    print(f"{what}: {regs} registers, no spills")
