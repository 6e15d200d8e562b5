# AOT ID: ['8_inference']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
from torch._inductor.runtime.runtime_utils import assert_tensor_metadata

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_size_stride_grouped = torch._C._dynamo.guards.assert_size_stride_grouped
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1 = args
        args.clear()
        assert_size_stride_grouped((arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1), ((4, 7, 16), (4, 7), (4, 7), (4, ), (4, 7, 16), (4, ), (4, ), (4, )), ((112, 16, 1), (7, 1), (7, 1), (1, ), (112, 16, 1), (1, ), (1, ), (1, )), 'input')
        # Topologically Sorted Source Nodes: [tree_rejection_sample_default], Original ATen: [specdec.tree_rejection_sample]
        buf0 = torch.ops.specdec.tree_rejection_sample.default(arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1)
        del arg0_1
        del arg1_1
        del arg2_1
        del arg3_1
        del arg4_1
        del arg5_1
        del arg6_1
        del arg7_1
        buf1 = buf0[0]
        assert_tensor_metadata(buf1, (4, 7), (7, 1), torch.int64, 'torch.ops.specdec.tree_rejection_sample.default')
        # buffer buf1 (op: torch.ops.specdec.tree_rejection_sample.default) is assumed to be not aligned
        buf2 = buf0[1]
        assert_tensor_metadata(buf2, (4, 7), (7, 1), torch.int32, 'torch.ops.specdec.tree_rejection_sample.default')
        # buffer buf2 (op: torch.ops.specdec.tree_rejection_sample.default) is assumed to be not aligned
        buf3 = buf0[2]
        assert_tensor_metadata(buf3, (4, ), (1, ), torch.int32, 'torch.ops.specdec.tree_rejection_sample.default')
        # buffer buf3 (op: torch.ops.specdec.tree_rejection_sample.default) is assumed to be not aligned
        return (buf1, buf2, buf3, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    arg0_1 = rand_strided((4, 7, 16), (112, 16, 1), device='cpu', dtype=torch.float32)
    arg1_1 = rand_strided((4, 7), (7, 1), device='cpu', dtype=torch.int64)
    arg2_1 = rand_strided((4, 7), (7, 1), device='cpu', dtype=torch.int64)
    arg3_1 = rand_strided((4, ), (1, ), device='cpu', dtype=torch.int64)
    arg4_1 = rand_strided((4, 7, 16), (112, 16, 1), device='cpu', dtype=torch.float32)
    arg5_1 = rand_strided((4, ), (1, ), device='cpu', dtype=torch.int64)
    arg6_1 = rand_strided((4, ), (1, ), device='cpu', dtype=torch.int64)
    arg7_1 = rand_strided((4, ), (1, ), device='cpu', dtype=torch.bool)
    return [arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat, device='cpu')


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
