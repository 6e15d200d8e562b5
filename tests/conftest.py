"""Shared test setup.

Without a GPU the Triton kernels run under the interpreter: TRITON_INTERPRET=1
must be set before triton is first imported, so it is set here, at collection.
Tests marked `cuda` skip without a CUDA device.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None

# Backends that run on CPU tensors here: C++, plain PyTorch, Triton interpreter.
CPU_BACKENDS = ["cpu", "reference"] + (["triton"] if HAS_TRITON else [])

# Under the interpreter, a launch's patching of triton.language is not repeated at every call of a jit helper
# inside it (most of the time of the split kernels' tests; see tests/interpreter_patching.py).
# SPECDEC_PLAIN_INTERPRETER=1 runs Triton's interpreter as it comes.
if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("SPECDEC_PLAIN_INTERPRETER", "0") == "0":
    from interpreter_patching import install as _install_interpreter_patching  # noqa: E402

    _install_interpreter_patching()


def pytest_runtest_logreport(report):
    """SPECDEC_FAILURE_LOG=path: each failed test's report is appended to that file as soon as it arrives (on
    the controlling process under pytest-xdist), so that a run cut off at a time limit, as on a lent GPU
    machine (bench/gpu_check.sh), still shows why each finished test failed."""
    path = os.environ.get("SPECDEC_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # (workers send it on to it)
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)


@pytest.fixture(autouse=True)
def _triton_interpret_left_as_found():
    """TRITON_INTERPRET is read by every Triton launch in this process: a test that changes it (an in-process
    script that lifts it to compile, say) breaks the tests its pytest worker runs next, far from the cause.
    Put it back and fail the test that changed it."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    after = os.environ.get("TRITON_INTERPRET")
    if after != before:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
        pytest.fail(f"the test changed TRITON_INTERPRET from {before!r} to {after!r} (put back)")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread while a module's tests run (tiny models: thread start-up costs more than it saves); put
    back after. A module takes it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request):
    """Each backend that runs on CPU tensors (triton: interpreter)."""
    return request.param


def compile_ahead_of_time(script: str) -> None:
    """Run tests/<script> (it compiles Triton kernels for sm_90 and prints "compiled") in a subprocess
    without TRITON_INTERPRET: the interpreter never runs Triton's code generator, the real compiler does.
    The limit is generous: the logits kernels' compile took over 300 s on a loaded 2-core machine."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, os.path.join(here, script)], env=env, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
