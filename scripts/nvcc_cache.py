#!/usr/bin/env python3
"""A cache of ptxas's device code for CI, so that the compatibility run's CUDA build (torch 2.11) reuses the
main build's sm_90 cubins instead of assembling the same PTX again (ptxas is most of a .cu file's compile).

Only CI uses it (.ci/run); a plain build never goes through it. What is reused, and when:

* Every step of nvcc still runs (preprocessing, the C++ front end with the build's own -std, cicc, the host
  compile, fatbinary), except ptxas when its input is byte-for-byte a PTX file that ptxas already assembled,
  with the same arguments (file names aside) and the same ptxas: the cubin it wrote then, and what it printed,
  are given back. The key: ptxas's --version, its arguments, the PTX's SHA-256. ptxas's spill check (-Werror)
  passed for every cubin kept; a failure is never kept.
* The PTX names the .cu file's path (-lineinfo's .file lines, and the hash in its anonymous namespace's mangled
  names), so the compatibility build's copy of the checkout would never match. With SPECDEC_NVCC_CACHE_REDIRECT
  set to "COPY=ORIGINAL" (directories), nvcc compiles ORIGINAL's file for a .cu under COPY, if and only if
  the .cu and every file it includes (nvcc -M with the build's own flags, run on both) are byte-identical in
  the two trees: the object is what the copy's file compiles to, but its line information names ORIGINAL.
* ptxas on a miss waits (no CPU) while the file SPECDEC_NVCC_CACHE_WAIT_FOR is absent (the main build has not
  finished: its cubin may still come), at most SPECDEC_NVCC_CACHE_WAIT_S seconds (default 1800), then runs.
* Anything unexpected in the cache's own work runs the real tool as it was asked.

    python3 scripts/nvcc_cache.py init DIR     # makes DIR/bin; prints the nvcc to give torch as PYTORCH_NVCC

DIR/bin holds `nvcc` (this script), `nvcc-real` (a link to $CUDA_HOME/bin/nvcc) and an nvcc.profile that puts
DIR/bin first on the PATH nvcc runs its tools with, where `ptxas` is this script too. Cache entries: DIR/ptxas/.
Each use is logged, one line each, to $SPECDEC_NVCC_CACHE_LOG (default DIR/cache.log).
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cache_dir():
    # bin/ is DIR/bin; this file, when run as DIR/bin/nvcc or DIR/bin/ptxas, is reached through a small shell script
    return os.environ["SPECDEC_NVCC_CACHE"]


def log(message):
    path = os.environ.get("SPECDEC_NVCC_CACHE_LOG") or os.path.join(cache_dir(), "cache.log")
    with open(path, "a") as f:
        f.write(f"[nvcc-cache {time.strftime('%H:%M:%S')}] {message}\n")


def real_tool(name):
    return os.path.join(os.environ["SPECDEC_NVCC_CACHE_CUDA"], "bin", name)


def init(directory):
    cuda = os.path.abspath(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    directory = os.path.abspath(directory)
    bindir = os.path.join(directory, "bin")
    os.makedirs(bindir, exist_ok=True)
    os.makedirs(os.path.join(directory, "ptxas"), exist_ok=True)
    with open(os.path.join(cuda, "bin", "nvcc.profile")) as f:
        profile = f.read()
    # nvcc reads the nvcc.profile beside the path it is run as: the toolkit stays where it is (TOP), and DIR/bin
    # comes first on the PATH it runs ptxas with.
    profile, n_top = re.subn(r"(?m)^TOP\s*=.*$", f"TOP = {cuda}", profile)
    profile, n_path = re.subn(r"(?m)^PATH\s*\+=.*$", f"PATH += {bindir}:$(CICC_PATH):{cuda}/bin:", profile)
    if n_top != 1 or n_path != 1:
        sys.exit(f"nvcc_cache: {cuda}/bin/nvcc.profile has no single TOP and PATH line to adapt")
    with open(os.path.join(bindir, "nvcc.profile"), "w") as f:
        f.write(profile)
    link = os.path.join(bindir, "nvcc-real")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join(cuda, "bin", "nvcc"), link)
    for tool in ("nvcc", "ptxas"):
        path = os.path.join(bindir, tool)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n"
                    f"SPECDEC_NVCC_CACHE='{directory}' SPECDEC_NVCC_CACHE_CUDA='{cuda}' "
                    f"exec '{sys.executable}' '{os.path.abspath(__file__)}' {tool} \"$@\"\n")
        os.chmod(path, 0o755)
    print(os.path.join(bindir, "nvcc"))


# ---------------------------------------------------------------------------------------------------------------- nvcc

def dependencies(args, source):
    """The files nvcc -M lists for `source` compiled with `args` (the build's flags, output options dropped)."""
    flags, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-MF", "-o"):
            skip = True
            continue
        if a in ("-MD", "-MMD", "-c") or a.endswith(".cu"):
            continue
        flags.append(a)
    bindir = os.path.join(cache_dir(), "bin")
    out = subprocess.run([os.path.join(bindir, "nvcc-real"), *flags, "-M", source], capture_output=True, text=True,
                         check=True).stdout
    words = [w for w in out.replace("\\\n", " ").split() if w != "\\"]
    return words[words.index(":") + 1:] if ":" in words else words[1:]


def redirect(args):
    """args with the .cu file under COPY replaced by ORIGINAL's, when the two compile from identical files."""
    spec = os.environ.get("SPECDEC_NVCC_CACHE_REDIRECT", "")
    if "=" not in spec:
        return args
    copy, original = (os.path.abspath(p) + os.sep for p in spec.split("=", 1))
    sources = [i for i, a in enumerate(args) if a.endswith(".cu") and os.path.isfile(a)]
    if len(sources) != 1 or not os.path.abspath(args[sources[0]]).startswith(copy):
        return args
    source = os.path.abspath(args[sources[0]])
    target = original + source[len(copy):]
    name = source[len(copy):]
    try:
        if not os.path.isfile(target):
            log(f"{name}: not in {original} (compiled from the copy)")
            return args
        mine, theirs = dependencies(args, source), dependencies(args, target)
        mapped = [original + d[len(copy):] if os.path.abspath(d).startswith(copy) else d for d in mine]
        if mapped != theirs:
            log(f"{name}: includes other files than {target} does (compiled from the copy)")
            return args
        for a, b in zip(mine, mapped):
            if a != b:
                with open(a, "rb") as fa, open(b, "rb") as fb:
                    if fa.read() != fb.read():
                        log(f"{name}: {a} differs from {b} (compiled from the copy)")
                        return args
    except Exception as exc:  # noqa: BLE001  (any doubt: compile the copy's file)
        log(f"{name}: comparing the sources failed ({type(exc).__name__}: {exc}); compiled from the copy")
        return args
    log(f"{name}: compiled as {target}: it and its {len(mine) - 1} included files are identical to the copy's")
    return [*args[:sources[0]], target, *args[sources[0] + 1:]]


def nvcc(args):
    real = os.path.join(cache_dir(), "bin", "nvcc-real")
    try:
        args = redirect(args)
    except Exception:  # noqa: BLE001
        pass
    os.execv(real, [real, *args])


# --------------------------------------------------------------------------------------------------------------- ptxas

def ptxas(args):
    real = real_tool("ptxas")
    try:
        rc = cached_ptxas(real, args)
    except Exception as exc:  # noqa: BLE001  (the cache's own failure: run ptxas as asked)
        try:
            log(f"ptxas: cache error ({type(exc).__name__}: {exc}); running ptxas")
        except Exception:  # noqa: BLE001
            pass
        os.execv(real, [real, *args])
    sys.exit(rc)


def cached_ptxas(real, args):
    inputs = [i for i, a in enumerate(args) if a.endswith(".ptx") and os.path.isfile(a)]
    outputs = [i + 1 for i, a in enumerate(args[:-1]) if a == "-o"]
    if len(inputs) != 1 or len(outputs) != 1:
        log(f"ptxas {' '.join(args)}: not a single .ptx input and -o output: not cached")
        os.execv(real, [real, *args])
    ptx, out = args[inputs[0]], args[outputs[0]]
    name = re.sub(r"^tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_", "", os.path.basename(ptx))
    normalized = [("<ptx>" if i == inputs[0] else "<out>" if i == outputs[0] else a) for i, a in enumerate(args)]
    version = subprocess.run([real, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256()
    for part in (os.path.realpath(real), version, "\0".join(normalized)):
        h.update(part.encode() + b"\0\0")
    with open(ptx, "rb") as f:
        h.update(f.read())
    key = h.hexdigest()
    entry = os.path.join(cache_dir(), "ptxas", key)

    marker = os.environ.get("SPECDEC_NVCC_CACHE_WAIT_FOR")
    if not os.path.isdir(entry) and marker and not os.path.exists(marker):
        limit = float(os.environ.get("SPECDEC_NVCC_CACHE_WAIT_S", "1800"))
        t0 = time.time()
        log(f"ptxas {name}: not in the cache yet; waiting for it or for {marker} (at most {limit:.0f} s)")
        while not os.path.isdir(entry) and not os.path.exists(marker) and time.time() - t0 < limit:
            time.sleep(2)
        log(f"ptxas {name}: waited {time.time() - t0:.0f} s")

    if os.path.isdir(entry):
        shutil.copyfile(os.path.join(entry, "cubin"), out)
        with open(os.path.join(entry, "stdout"), "rb") as f:
            sys.stdout.buffer.write(f.read())
        with open(os.path.join(entry, "stderr"), "rb") as f:
            sys.stderr.buffer.write(f.read())
        log(f"ptxas {name}: HIT {key[:16]} (cubin reused, ptxas not run)")
        return 0

    t0 = time.time()
    result = subprocess.run([real, *args], capture_output=True)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    seconds = time.time() - t0
    if result.returncode != 0 or not os.path.isfile(out):
        log(f"ptxas {name}: MISS {key[:16]}, ptxas failed (exit {result.returncode}, {seconds:.0f} s): not kept")
        return result.returncode
    tmp = tempfile.mkdtemp(prefix=".new-", dir=os.path.join(cache_dir(), "ptxas"))
    shutil.copyfile(out, os.path.join(tmp, "cubin"))
    for what, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        with open(os.path.join(tmp, what), "wb") as f:
            f.write(data)
    with open(os.path.join(tmp, "args"), "w") as f:
        f.write(" ".join(normalized) + "\n")
    try:
        os.rename(tmp, entry)  # atomic: a reader sees a whole entry or none
    except OSError:  # another build stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"ptxas {name}: MISS {key[:16]}, ran ptxas ({seconds:.0f} s), kept")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "init" and len(sys.argv) == 3:
        init(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "nvcc":
        nvcc(sys.argv[2:])
    elif len(sys.argv) >= 2 and sys.argv[1] == "ptxas":
        ptxas(sys.argv[2:])
    else:
        sys.exit(__doc__)
