"""The build's declared support range and its one-line failures.

setup.py checks Python, setuptools and torch before importing either (on Python 3.12 a setuptools older
than 66.1 fails on import), and stops with one line naming the cause. These tests run setup.py in a
subprocess with stand-in packages first on the path: a `torch` whose version is too old, a setuptools
distribution whose metadata says 60.0.0, or no site-packages at all.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "setup.py")
PYPROJECT = os.path.join(ROOT, "pyproject.toml")


def setup_constants():
    """MIN_PYTHON, MIN_TORCH and MIN_SETUPTOOLS for Python < 3.12 and >= 3.12, read from setup.py's source."""
    found = {}
    for node in ast.parse(open(SETUP).read()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.startswith("MIN_"):
            value = node.value
            if isinstance(value, ast.IfExp):  # MIN_SETUPTOOLS = (...) if sys.version_info >= (3, 12) else (...)
                found[node.targets[0].id] = {"3.12": ast.literal_eval(value.body),
                                             "3.11": ast.literal_eval(value.orelse)}
            else:
                found[node.targets[0].id] = ast.literal_eval(value)
    return found


def dotted(version):
    return ".".join(str(p) for p in version)


def run_setup(tmp_path, *args, python_flags=()):
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    return subprocess.run([sys.executable, *python_flags, SETUP, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def fake_setuptools(tmp_path, version):
    info = tmp_path / f"setuptools-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: setuptools\nVersion: {version}\n")


def test_pyproject_declares_the_minimums_setup_py_enforces():
    consts = setup_constants()
    with open(PYPROJECT, "rb") as f:
        project = tomllib.load(f)
    requires = project["build-system"]["requires"]
    assert f"setuptools>={dotted(consts['MIN_SETUPTOOLS']['3.11'])}; python_version < '3.12'" in requires
    assert f"setuptools>={dotted(consts['MIN_SETUPTOOLS']['3.12'])}; python_version >= '3.12'" in requires
    torch_min = f"torch>={dotted(consts['MIN_TORCH'])}"
    assert torch_min in requires
    assert torch_min in project["project"]["dependencies"]
    assert project["project"]["requires-python"] == f">={dotted(consts['MIN_PYTHON'])}"
    assert "triton>=3.6" in project["project"]["optional-dependencies"]["triton"]


def test_pyproject_project_table_validates_on_this_setuptools():
    # The schema check that failed on setuptools 65.5 for the SPDX string `license`; warnings are errors.
    from setuptools.config.pyprojecttoml import load_file, validate

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate(load_file(PYPROJECT), PYPROJECT)


def test_setup_writes_license_metadata_without_deprecation_warnings(tmp_path):
    # egg_info applies pyproject.toml as a build does (newer setuptools warn there about deprecated license
    # forms) and takes the license from setup.py (it is dynamic), without compiling anything.
    env = dict(os.environ, SPECDEC_NO_CUDA="1")
    result = subprocess.run([sys.executable, SETUP, "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "deprecat" not in result.stderr.lower(), result.stderr
    metadata = (tmp_path / "specdec_ops.egg-info" / "PKG-INFO").read_text().splitlines()
    assert "Name: specdec_ops" in metadata or "Name: specdec-ops" in metadata  # normalized by older setuptools
    assert "License-Expression: Apache-2.0" in metadata or "License: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata


def test_old_torch_stops_with_one_line(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.10.0+cu128"\n')
    result = run_setup(tmp_path, "--name")
    assert result.returncode == 1
    assert result.stderr.strip() == ("specdec_ops build: torch >= 2.11 is required (found 2.10.0+cu128); "
                                     "run pip install -U 'torch>=2.11'")


def test_old_setuptools_stops_with_one_line(tmp_path):
    fake_setuptools(tmp_path, "60.0.0")
    result = run_setup(tmp_path, "--name")
    minimum = dotted(setup_constants()["MIN_SETUPTOOLS"]["3.12" if sys.version_info >= (3, 12) else "3.11"])
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"specdec_ops build: setuptools >= {minimum} is required on Python {sys.version_info[0]}."
        f"{sys.version_info[1]} (found 60.0.0); run pip install -U setuptools")


def test_missing_torch_stops_with_one_line(tmp_path):
    # -S: no site-packages, so neither the real torch nor the real setuptools is found; a new enough
    # setuptools version is stood in so that the torch check is the one that fires.
    fake_setuptools(tmp_path, "80.0.0")
    result = run_setup(tmp_path, "--name", python_flags=("-S",))
    assert result.returncode == 1
    assert result.stderr.strip().startswith("specdec_ops build: torch >= 2.11 is required and not installed")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("version, expected", [("2.11.0+cu130", (2, 11, 0)), ("2.10.0a0+git1234", (2, 10, 0)),
                                               ("66.1.0", (66, 1, 0)), ("3.9.0", (3, 9, 0))])
def test_release_parsing_orders_versions_numerically(version, expected):
    # release() is defined before setup.py imports anything heavy; exec just that function.
    tree = ast.parse(open(SETUP).read())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "release")
    namespace = {"re": __import__("re")}
    exec(compile(ast.Module(body=[func], type_ignores=[]), SETUP, "exec"), namespace)
    assert namespace["release"](version) == expected
    assert namespace["release"]("2.9.1") < (2, 11) <= namespace["release"]("2.11.0")


def setup_functions(*names):
    """Functions of setup.py, executed alone (setup.py itself builds when run)."""
    tree = ast.parse(open(SETUP).read())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    namespace = {m: __import__(m) for m in ("os", "shlex", "struct", "subprocess", "sys", "tempfile")}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), SETUP, "exec"), namespace)
    return namespace


def test_extension_runs_on_the_shared_libstdcxx():
    # A private copy of libstdc++ in the extension (a toolchain that links it statically) breaks every C++
    # error message with a number in it: the first GPU machine's /opt/gcc did that, and kv_commit's device
    # check segfaulted. The built extension must depend on the shared library instead.
    ext = pytest.importorskip("specdec_ops._C", reason="the extension is not built here (setup.py checks only)")
    needed = setup_functions("elf_needed")["elf_needed"](ext.__file__)
    assert any(n.startswith("libstdc++.so") for n in needed), needed
    assert "libc.so.6" in needed
    readelf = shutil.which("readelf")
    if readelf:  # the parser against binutils' reading of the same file
        out = subprocess.run([readelf, "-d", ext.__file__], capture_output=True, text=True).stdout
        assert needed == re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)


def test_a_toolchain_linking_libstdcxx_statically_is_detected_and_relinked(tmp_path, monkeypatch):
    gxx = shutil.which("g++")
    if gxx is None or subprocess.run([gxx, "-print-file-name=libstdc++.a"], capture_output=True,
                                     text=True).stdout.strip() == "libstdc++.a":
        pytest.skip("needs g++ with libstdc++.a")
    import torch  # noqa: F401  (loads the libstdc++ torch runs with, as in setup.py)

    f = setup_functions("elf_needed", "links_libstdcxx_statically", "process_libstdcxx", "libstdcxx_link_args")
    assert f["links_libstdcxx_statically"]([gxx]) is False
    assert f["links_libstdcxx_statically"]([gxx, "-static-libstdc++"]) is True
    assert f["links_libstdcxx_statically"]([str(tmp_path / "no-such-compiler")]) is None
    lib = f["process_libstdcxx"]()
    assert lib is not None and os.path.basename(lib).startswith("libstdc++.so") and os.path.exists(lib)
    # a compiler that links it statically gets the process's libstdc++ named on the link line; others nothing
    wrapper = tmp_path / "g++-static"
    wrapper.write_text(f'#!/bin/sh\nexec {gxx} -static-libstdc++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert f["libstdcxx_link_args"]() == [lib]
    monkeypatch.setenv("CXX", gxx)
    monkeypatch.setenv("PATH", os.path.dirname(gxx))  # c++ on PATH: the same kind of compiler
    assert f["libstdcxx_link_args"]() == []
    # and what the link arguments do: the probe linked with them depends on the shared library
    src = tmp_path / "p.cpp"
    src.write_text("#include <sstream>\nstd::string t(unsigned long x) { std::ostringstream s; s << x; return s.str(); }\n")
    out = tmp_path / "p.so"
    subprocess.run([str(wrapper), "-shared", "-fPIC", str(src), "-o", str(out), lib], check=True)
    assert any(n.startswith("libstdc++.so") for n in f["elf_needed"](str(out)))


def test_cmake_builds_have_the_same_libstdcxx_guard(tmp_path):
    """CMakeLists.txt's op library takes cmake/libstdcxx.cmake's verdict (setup.py's probe, in CMake): shared for
    g++, static with the libstdc++ of the given Python's torch for a -static-libstdc++ wrapper, no verdict for a
    compiler that does not run."""
    cmake, gxx = shutil.which("cmake"), shutil.which("g++")
    if cmake is None or gxx is None or subprocess.run([gxx, "-print-file-name=libstdc++.a"], capture_output=True,
                                                      text=True).stdout.strip() == "libstdc++.a":
        pytest.skip("needs cmake and g++ with libstdc++.a")
    script = os.path.join(os.path.dirname(SETUP), "cmake", "libstdcxx.cmake")
    wrapper = tmp_path / "g++-static"
    wrapper.write_text(f'#!/bin/sh\nexec {gxx} -static-libstdc++ "$@"\n')
    wrapper.chmod(0o755)

    def verdict(*defs):
        r = subprocess.run([cmake, *(f"-D{d}" for d in defs), "-P", script], cwd=tmp_path, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        return r.stderr.strip()

    assert verdict(f"CXX={gxx}") == "shared"
    static = verdict(f"CXX={wrapper}", f"PYTHON={sys.executable}")
    assert static.startswith("static: ") and os.path.basename(static[8:]).startswith("libstdc++.so"), static
    assert os.path.exists(static[8:])
    assert verdict(f"CXX={wrapper}") == "static: none found"
    assert verdict(f"CXX={tmp_path / 'no-such-compiler'}") == "no verdict"
    text = open(os.path.join(os.path.dirname(SETUP), "CMakeLists.txt")).read()
    assert "specdec_libstdcxx_check(" in text and "${SPECDEC_LIBSTDCXX}" in text
