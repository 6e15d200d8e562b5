"""Compiles the kv_commit Triton kernels (moves of every cache, then seq_lens) for sm_90 ahead of time (no GPU
needed); run by test_kv_commit.py::test_triton_kernels_compile_for_sm90_without_a_gpu in a subprocess without
TRITON_INTERPRET. Every variant the launcher picks (element size, paged or not, general or contiguous rows,
16-byte vectors or not) must compile without spills; where the launcher promises 16-byte alignment (VEC > 1)
the moves must be vector loads and stores: 16 bytes per thread for 2- and 4-byte elements, 8 for 1-byte ones
(BLOCK = 1024 over 128 threads)."""

import re

from aot_common import check, compile_kernel

from specdec_ops.triton_kernels.kv_commit import kv_advance_kernel, kv_move_kernel

types = dict(cache_addresses_ptr="*i64", cache_geometry_ptr="*i64", seq_lens_ptr="*i32", path_ptr="*i32",
             block_table_ptr="*i32", max_path="i32", path_stride="i32", capacity="i64", block_size="i32",
             num_blocks="i32", block_table_stride="i32")

for paged in (False, True):
    for elem_bytes in (1, 2, 4):
        for contiguous_rows, vec in ((False, 1), (True, 1), (True, 16 // elem_bytes)):
            const = dict(ELEM_BYTES=elem_bytes, PAGED=paged, BLOCK_M=8, BLOCK=1024, ROW_TILES=1,
                         CONTIGUOUS_ROWS=contiguous_rows, VEC=vec)
            what = f"kv_move paged={paged} elem={elem_bytes} contiguous_rows={contiguous_rows} vec={vec}"
            kernel = compile_kernel(kv_move_kernel, types, const, num_warps=4)
            check(kernel, what, vector_loads=vec > 1)
            if vec > 1:  # the only global stores are the moves: all of them vectors of the promised width
                width = "v2" if elem_bytes == 1 else "v4"
                stores = re.findall(r"st\.global(?:\.\w+)*", kernel.asm["ptx"])
                assert stores and all(f".{width}." in s + "." for s in stores), (what, sorted(set(stores)))
                loads = re.findall(r"ld\.global(?:\.\w+)*\.%s\.b32" % width, kernel.asm["ptx"])
                assert loads, (what, "no vector loads of the moved rows")
    check(compile_kernel(kv_advance_kernel, types, dict(PAGED=paged, BLOCK_M=8), num_warps=4),
          f"kv_advance paged={paged}")
print("compiled")
