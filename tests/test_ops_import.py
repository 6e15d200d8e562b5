"""What `import specdec_ops` costs and marks: the compile-constant mark without torch._dynamo."""

import subprocess
import sys

import torch

from specdec_ops import _backend, _ops


def test_the_mark_is_torch_compilers_own():
    def ours():
        return 1

    def theirs():
        return 1

    _ops.constant_under_compile(ours)
    torch.compiler.assume_constant_result(theirs)
    assert vars(ours) == vars(theirs) and vars(ours)  # the same attributes, and at least one
    for fn in (_ops.has_kernel, _backend.resolve_backend):
        assert {k: getattr(fn, k, None) for k in vars(theirs)} == vars(theirs)


def test_resolve_backend_is_baked_into_a_fullgraph_compile():
    @torch.compile(fullgraph=True, backend="eager")
    def pick(x):
        return x + (1 if _backend.resolve_backend(None, x.device, "rejection_sample",
                                                   native_op="rejection_sample") == "cpu" else 2)

    assert pick(torch.zeros(2)).tolist() == [1.0, 1.0]


def test_importing_the_package_does_not_import_dynamo():
    code = ("import sys, torch; before = 'torch._dynamo' in sys.modules; import specdec_ops; "
            "print(before, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == before, "import specdec_ops imported torch._dynamo (about 1.5 s per process)"
