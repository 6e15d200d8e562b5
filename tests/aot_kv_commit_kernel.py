"""Compiles the kv_commit Triton kernels (moves of every cache, then seq_lens) for sm_90 ahead of time (no GPU
needed) and checks that no variant spills (cuobjdump from Triton's own CUDA tools: STACK:0); run by
test_kv_commit.py::test_triton_kernels_compile_for_sm90_without_a_gpu in a subprocess without TRITON_INTERPRET."""

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_ops.triton_kernels.kv_commit import kv_advance_kernel, kv_move_kernel
target = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
types = dict(cache_addresses_ptr="*i64", cache_geometry_ptr="*i64", seq_lens_ptr="*i32", path_ptr="*i32",
             block_table_ptr="*i32", max_path="i32", path_stride="i32", capacity="i64", block_size="i32",
             num_blocks="i32", block_table_stride="i32")


def compile_variant(fn, const):
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else types[n] for n in names}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()})
    kernel = triton.compile(src, target=target, options=dict(num_warps=4))
    if os.path.exists(CUOBJDUMP):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        stack = re.search(r"STACK:(\d+)", usage)
        assert stack is not None and int(stack.group(1)) == 0, (fn.__name__, const, usage)


for paged in (False, True):
    for elem_bytes in (1, 2, 4):
        compile_variant(kv_move_kernel, dict(ELEM_BYTES=elem_bytes, PAGED=paged, BLOCK_M=8, BLOCK=1024, ROW_TILES=1))
    compile_variant(kv_advance_kernel, dict(PAGED=paged, BLOCK_M=8))
print("compiled")
