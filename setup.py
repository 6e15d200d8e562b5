"""Build specdec_ops._C.

CUDA kernels are compiled when a CUDA build of torch and nvcc are present (arch
list from TORCH_CUDA_ARCH_LIST, default "8.0;9.0"); the C++ CPU kernels always.
SPECDEC_NO_CUDA=1 forces a CPU-only build. Install with
`pip install --no-build-isolation -e .` so the build sees the installed torch.

Sources follow one rule shared with CMakeLists.txt (see `native_sources`): every
`csrc/**/*.cpp` is a host source, every `csrc/**/*.cu` a CUDA source.
"""

import glob
import importlib.util
import os
import shutil

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def native_sources():
    cpp = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    cu = sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    return cpp, cu


def nvidia_wheel_includes():
    """Include dirs of the nvidia-* wheels (CUDA headers that torch's wheels ship)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for base in spec.submodule_search_locations:
        dirs += sorted(glob.glob(os.path.join(base, "cu*", "include")))
        dirs += sorted(glob.glob(os.path.join(base, "*", "include")))
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def want_cuda(torch, cpp_extension):
    if os.environ.get("SPECDEC_NO_CUDA", "0") not in ("", "0"):
        print("specdec_ops: SPECDEC_NO_CUDA set, building the CPU kernels only")
        return False
    if torch.version.cuda is None:
        print("specdec_ops: CPU build of torch, building the CPU kernels only")
        return False
    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        print("specdec_ops: nvcc not found (set CUDA_HOME), building the CPU kernels only")
        return False
    return True


def extensions():
    # CUDA_HOME defaults to /usr/local/cuda (torch would otherwise derive it from the nvcc on PATH,
    # which may be a symlink outside the toolkit).
    if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    import torch
    from torch.utils import cpp_extension

    cpp, cu = native_sources()
    cxx_flags = ["-O3"]  # torch picks the C++ standard its headers need
    if want_cuda(torch, cpp_extension):
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
        print(f"specdec_ops: building CUDA kernels for {os.environ['TORCH_CUDA_ARCH_LIST']}")
        # The nvidia-* wheels carry headers the CUDA toolkit install may lack (cuBLAS, cuSPARSE, ...,
        # which ATen's CUDA headers include) but also partial copies of the runtime headers: search
        # them after the toolkit's own include dir (-idirafter), for the host compiler only (.cu files
        # include no torch headers).
        for inc in nvidia_wheel_includes():
            cxx_flags += ["-idirafter", inc]
        ext = cpp_extension.CUDAExtension(
            "specdec_ops._C",
            cpp + cu,
            include_dirs=[os.path.join(cpp_extension.CUDA_HOME, "include")],
            define_macros=[("SPECDEC_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-lineinfo"]},
        )
    else:
        ext = cpp_extension.CppExtension("specdec_ops._C", cpp, extra_compile_args={"cxx": cxx_flags})
    return [ext], {"build_ext": cpp_extension.BuildExtension}


ext_modules, cmdclass = extensions()

setup(
    packages=find_packages(include=["specdec_ops", "specdec_ops.*"]) + ["specdec_ops.triton_kernels"],
    package_dir={"specdec_ops.triton_kernels": "triton_kernels"},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
