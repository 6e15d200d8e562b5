"""tests/interpreter_patching.py: in force on the supported Triton versions under the interpreter, same results
as the plain interpreter, and triton.language left as found after every launch."""

import dataclasses
import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import interpreter_patching  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _plus_twice(x, y):
    return x + _twice(y)                  # a helper calling a helper


@triton.jit
def _kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    for _ in range(2):
        x = _plus_twice(x, y)
    tl.store(out_ptr + offs, _twice(x), mask=mask)


def _language():
    """What a launch patches: the members of triton.language, its core, math and tensor class."""
    return {(name, key): value for name, obj in (("tl", tl), ("core", tl.core), ("math", tl.math), ("tensor", tl.tensor))
            for key, value in vars(obj).items()}


def _builtins_as_found(found):
    """Every member the same object as before the launch. New ones may only be dunders: Triton's own restore
    leaves the inherited `tensor.__repr__` it replaced as a class attribute, and inspect adds `__annotations__`."""
    now = _language()
    return (all(k in now and now[k] is v for k, v in found.items())
            and all(key.startswith("__") for _, key in now.keys() - found.keys()))


def test_in_force_on_the_supported_versions():
    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    if (3, 6) <= (major, minor) <= (3, 9) and os.environ.get("SPECDEC_PLAIN_INTERPRETER", "0") == "0":
        assert interpreter_patching.install()


def test_results_and_language_restored_after_each_launch():
    x = torch.arange(37, dtype=torch.float32)
    y = torch.full((37,), 0.5)
    for block in (16, 64):                 # several programs, then one
        out = torch.empty_like(x)
        found = _language()
        _kernel[(triton.cdiv(37, block),)](x, y, out, 37, BLOCK=block)
        torch.testing.assert_close(out, 2 * (x + 2 * y + 2 * y))
        assert _builtins_as_found(found)


def test_a_failing_launch_leaves_the_language_as_found():
    x = torch.arange(8, dtype=torch.float32)
    found = _language()
    with pytest.raises(Exception):
        _kernel[(1,)](x, x, torch.empty(8), 8, BLOCK=6)   # not a power of two: arange refuses
    assert _builtins_as_found(found)
    out = torch.empty(8)
    _kernel[(1,)](x, x, out, 8, BLOCK=8)                 # and the next launch works
    torch.testing.assert_close(out, 2 * (5 * x))


def test_remembered_np_dtypes_are_the_interpreters():
    from triton.runtime import interpreter

    get = interpreter._get_np_dtype
    original = getattr(get, "original", None)
    if original is None:
        pytest.skip("the interpreter's own _get_np_dtype is in use")
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    pointers = [tl.pointer_type(t) for t in (tl.float32, tl.bfloat16, tl.int64)]
    types = scalars + pointers + [tl.block_type(t, [4, 8]) for t in scalars + pointers]
    for _ in range(2):  # the first answer is remembered, the second comes from memory
        for t in types:
            assert get(t) == original(t), t


@triton.jit
def _add_i32(x_ptr, y, out_ptr):
    tl.store(out_ptr, tl.load(x_ptr) + y)


def test_overflow_checks_run_only_with_debug_on():
    """The interpreter's int32 overflow check (skipped without debug by interpreter_patching) still fails an
    overflowing add with the interpreter's debug option on, and without it the add wraps as before."""
    from triton.runtime import interpreter

    x = torch.tensor([2**31 - 1], dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    _add_i32[(1,)](x, 1, out)
    assert int(out) == -(2**31)
    builder = interpreter.interpreter_builder
    options = builder.options
    assert not options.debug
    if not dataclasses.is_dataclass(options):
        pytest.skip("the interpreter's options are no dataclass here (Triton 3.6 and 3.8: a frozen one)")
    builder.options = dataclasses.replace(options, debug=True)
    try:
        with pytest.raises(Exception, match="overflow"):
            _add_i32[(1,)](x, 1, out)
        _add_i32[(1,)](x, -1, out)  # no overflow: no error
        assert int(out) == 2**31 - 2
    finally:
        builder.options = options
