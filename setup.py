"""Build specdec_ops._C.

CUDA kernels are compiled when a CUDA build of torch and nvcc are present (arch
list from TORCH_CUDA_ARCH_LIST, default "8.0;9.0"); the C++ CPU kernels always.
SPECDEC_NO_CUDA=1 forces a CPU-only build; SPECDEC_DEBUG=1 keeps the host code's debug
information (-g; dropped otherwise); SPECDEC_FAIL_ON_SPILLS=1 (CI) makes ptxas fail the build
on any register spill or local-memory use, for every arch compiled. Install with
`pip install --no-build-isolation -e .` so the build sees the installed torch.

Before importing setuptools or torch, the build checks the supported range
(Python >= 3.11, setuptools >= 64, >= 66.1 on Python 3.12, torch >= 2.11, and an
nvcc of torch's CUDA major version when CUDA kernels are built) and stops with
one line naming what is missing.

Sources follow one rule shared with CMakeLists.txt (see `native_sources`): every
`csrc/**/*.cpp` is a host source, every `csrc/**/*.cu` a CUDA source, except the torch glue files
`csrc/*/*_op.cpp`, which `csrc/torch_ops.cpp` compiles as one translation unit.
"""

import glob
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))

# The supported build range (pyproject.toml's [build-system] says the same; tests/test_build.py checks
# that the two agree). On Python 3.12 setuptools before 66.1 cannot even be imported.
MIN_PYTHON = (3, 11)
MIN_SETUPTOOLS = (66, 1) if sys.version_info >= (3, 12) else (64,)
MIN_TORCH = (2, 11)


def release(version):
    """Leading numeric release of a version string: "2.11.0+cu130" -> (2, 11, 0)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def dotted(version):
    return ".".join(str(p) for p in version)


def fail(message):
    """Stop the build with one line that names the cause."""
    sys.exit(f"specdec_ops build: {message}")


def check_build_requirements():
    """Python, setuptools and torch, checked before setuptools or torch is imported."""
    if sys.version_info < MIN_PYTHON:
        fail(f"Python >= {dotted(MIN_PYTHON)} is required (this is {sys.version.split()[0]})")
    try:
        found = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found is None or release(found) < MIN_SETUPTOOLS:
        what = f"found {found}" if found else "not installed"
        fail(f"setuptools >= {dotted(MIN_SETUPTOOLS)} is required on Python {sys.version_info[0]}."
             f"{sys.version_info[1]} ({what}); run pip install -U setuptools")
    if importlib.util.find_spec("torch") is None:
        fail(f"torch >= {dotted(MIN_TORCH)} is required and not installed (the extension compiles against the "
             f"installed torch): pip install 'torch>={dotted(MIN_TORCH)}', then pip install --no-build-isolation -e .")
    try:
        import torch
    except Exception as exc:  # a broken torch install: say so instead of a traceback from deep inside
        fail(f"torch is installed but does not import ({type(exc).__name__}: {exc})")
    if release(torch.__version__) < MIN_TORCH:
        fail(f"torch >= {dotted(MIN_TORCH)} is required (found {torch.__version__}); "
             f"run pip install -U 'torch>={dotted(MIN_TORCH)}'")


check_build_requirements()

import setuptools  # noqa: E402  (after the checks: on Python 3.12 an old setuptools fails on import)
from setuptools import find_packages, setup  # noqa: E402


def native_sources():
    # The *_op.cpp glue files are compiled through csrc/torch_ops.cpp (one parse of ATen's headers for all).
    cpp = sorted(f for f in glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True) if not f.endswith("_op.cpp"))
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


def elf_needed(path):
    """The DT_NEEDED entries (sonames) of a 64-bit little-endian ELF shared object."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 6:  # SHT_DYNAMIC; its sh_link is the string table of the names
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, entsize or 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + value)
                needed.append(data[strtab + value:end].decode())
    return needed


def links_libstdcxx_statically(compiler):
    """Whether ``compiler -shared`` puts a private copy of libstdc++ into a shared object (a toolchain built
    with static standard libraries, or with libstdc++.a alone): link a few lines that use an ostringstream and
    see whether the result depends on libstdc++.so. None when the probe does not build (no verdict)."""
    source = "#include <sstream>\nstd::string text(unsigned long x) { std::ostringstream s; s << x; return s.str(); }\n"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write(source)
        try:
            result = subprocess.run([*compiler, "-shared", "-fPIC", "-O0", src, "-o", out], capture_output=True)
            if result.returncode != 0:
                return None
            return not any(n.startswith("libstdc++.so") for n in elf_needed(out))
        except (OSError, ValueError):
            return None


def process_libstdcxx():
    """The libstdc++ this process runs with (torch's, once torch is imported), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libstdc++.so" in line}
    except OSError:
        return None
    return sorted(paths)[0] if paths else None


def libstdcxx_link_args():
    """Link arguments that keep the extension on the libstdc++ torch runs with.

    A compiler that links libstdc++ statically gives the extension its own copy: its functions then run on
    torch's streams and locale (data binds to the process's libstdc++), and formatting a number in an error
    message (c10::str, every TORCH_CHECK with an index) crashes or truncates the message. Naming the process's
    libstdc++.so.6 before the compiler's own archive links every symbol it has dynamically."""
    if not sys.platform.startswith("linux"):
        return []
    # the compiler the build links with: $CXX where set (torch's extensions use it), else c++ on PATH
    candidates = [shlex.split(c) for c in dict.fromkeys(filter(None, (os.environ.get("CXX"), "c++")))]
    static = next((c for c in candidates if links_libstdcxx_statically(c)), None)
    if static is None:
        return []
    lib = process_libstdcxx()
    if lib is None:
        print(f"specdec_ops: warning: {static[0]} links libstdc++ statically and this process's libstdc++ "
              "was not found: C++ error messages with numbers may crash (set CXX to another compiler)")
        return []
    print(f"specdec_ops: {static[0]} links libstdc++ statically: linking {lib} (torch's) instead")
    return [lib]


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
    # torch refuses an nvcc of another CUDA major version, after a long message; say it in one line first.
    output = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+)\.(\d+)", output)
    if match and match.group(1) != torch.version.cuda.split(".")[0]:
        fail(f"{nvcc} is CUDA {match.group(1)}.{match.group(2)} but torch {torch.__version__} was built with CUDA "
             f"{torch.version.cuda}: set CUDA_HOME to a CUDA {torch.version.cuda.split('.')[0]}.x toolkit, or "
             "SPECDEC_NO_CUDA=1 to build the CPU kernels only")
    return True


def nvcc_flags():
    flags = ["-O3", "-lineinfo"]
    if os.environ.get("SPECDEC_FAIL_ON_SPILLS", "0") == "1":
        flags.append("-Xptxas=-warn-spills,-warn-lmem-usage,-Werror")
    return flags


def extensions():
    # CUDA_HOME defaults to /usr/local/cuda (torch would otherwise derive it from the nvcc on PATH,
    # which may be a symlink outside the toolkit).
    if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    import torch
    from torch.utils import cpp_extension

    cpp, cu = native_sources()
    # torch picks the C++ standard its headers need. Without debug information (Python's CFLAGS ask for -g): the
    # host files instantiate torch's templates, whose debug information halves their compile speed and makes
    # half of the library (27 MB instead of 13 MB for sm_90); SPECDEC_DEBUG=1 keeps it.
    cxx_flags = ["-O3"] + ([] if os.environ.get("SPECDEC_DEBUG", "0") not in ("", "0") else ["-g0"])
    link_args = libstdcxx_link_args()  # (torch is imported: its libstdc++ is loaded)
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
            extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags()},
            extra_link_args=link_args,
        )
    else:
        ext = cpp_extension.CppExtension("specdec_ops._C", cpp, extra_compile_args={"cxx": cxx_flags},
                                         extra_link_args=link_args)
    return [ext], {"build_ext": cpp_extension.BuildExtension}


ext_modules, cmdclass = extensions()

# License metadata: an SPDX expression where setuptools knows the field (>= 77), the plain License field before.
LICENSE = ({"license_expression": "Apache-2.0"} if release(setuptools.__version__) >= (77,)
           else {"license": "Apache-2.0"})

setup(
    **LICENSE,
    packages=find_packages(include=["specdec_ops", "specdec_ops.*"]) + ["specdec_ops.triton_kernels"],
    package_dir={"specdec_ops.triton_kernels": "triton_kernels"},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
