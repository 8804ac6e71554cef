"""python_install: `pip install ./python` into a fresh venv compiles libkvnode_client.so and ships
it in the package, and the installed package works in any process, with no environment variable.

1. A fresh venv of this interpreter (no system site-packages), filled by this interpreter's pip.
2. `pip install ./python` from the repository root: scikit-build-core, the repository's CMake in
   KVNODE_PYTHON_PACKAGE mode, numpy as a dependency. PATH is the venv's and the system's folders
   only: a cmake or ninja that is a pip console script of another Python (pyenv's shims) cannot
   run inside pip's isolated build environment, and scikit-build-core would then fetch CMake from
   PyPI; Debian's cmake (3.25) and ninja are what a plain machine has.
3. A fresh process of the venv's python, isolated (-I), with an environment of PATH alone (no
   KVNODE_CLIENT_LIB, PYTHONPATH, LD_PRELOAD), in a folder outside the tree: kvnode and numpy come
   from the venv, the library mapped is the bundled kvnode/_native/libkvnode_client.so, and
   connect() to a path where nothing listens raises kvnode.Error (status not_found, from the
   library, naming the path).
4. The library has no RPATH/RUNPATH, and the source tree holds no new files (git status).

--build-dir DIR keeps scikit-build-core's build folder between runs (ctest passes one in its
binary folder), so a rerun compiles only what changed; without it pip builds in a temporary
folder, as a user's `pip install ./python` does. Each step's time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Set

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# Variables a developer's or ctest's environment may carry that would point the build or the
# package elsewhere.
DROPPED = ("KVNODE_CLIENT_LIB", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_PRELOAD",
           "LD_LIBRARY_PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "VIRTUAL_ENV", "PYTHONNOUSERSITE")

CHILD = r"""
import json, os, sys
import numpy
import kvnode
from kvnode import _lib
lib = _lib.library()
with open("/proc/self/maps") as f:
    mapped = sorted({line.split(None, 5)[5].strip() for line in f
                     if "libkvnode_client" in line and len(line.split(None, 5)) == 6})
error = None
try:
    kvnode.connect(sys.argv[1], timeout=5)
except kvnode.Error as e:
    error = {"status": e.status, "code": e.code, "message": str(e)}
print(json.dumps({"kvnode": kvnode.__file__, "numpy": numpy.__file__, "lib": lib._name,
                  "mapped": mapped, "error": error, "env": sorted(os.environ)}))
"""


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def run(step: str, cmd: List[str], log: Path, **kwargs) -> subprocess.CompletedProcess:
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    log.write_text(out.stdout + out.stderr)
    print(f"{step}: {time.monotonic() - start:.1f} s (rc {out.returncode})", flush=True)
    if out.returncode != 0:
        print((out.stdout + out.stderr)[-6000:])
        fail(f"{step} failed: {' '.join(map(str, cmd))}")
    return out


def new_files() -> Set[str]:
    """Untracked and ignored entries of git status under python/ and at the top of the tree
    (the pyproject's folder and the CMake source): where a build could write. Caches of Python's
    own (__pycache__) are left out: other tests import from the tree."""
    out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain=v1", "--ignored",
                          "--untracked-files=normal"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return set()
    entries = set()
    for line in out.stdout.splitlines():
        code, path = line[:2], line[3:]
        top = "/" not in path.rstrip("/")
        if code in ("??", "!!") and (top or path.startswith("python/")) \
                and "__pycache__" not in path:
            entries.add(path)
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", help="scikit-build-core's build folder, kept")
    args = parser.parse_args()
    git = shutil.which("git") and (ROOT / ".git").exists()
    before = new_files() if git else set()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kvnode-install-test-"))
    try:
        venv = tmp / "venv"
        # Without pip of its own (ensurepip takes 5-10 s): this interpreter's pip installs into
        # it (--python), as the venv's own pip would.
        run("venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp / "venv.log",
            timeout=120)
        python = venv / "bin" / "python"

        env = {k: v for k, v in os.environ.items() if k not in DROPPED}
        env["PATH"] = f"{venv / 'bin'}:{SYSTEM_PATH}"
        pip = [sys.executable, "-m", "pip", "--python", str(python), "install",
               "--disable-pip-version-check", "--no-input",
               "--progress-bar", "off", "./python"]
        if args.build_dir:
            pip += ["-C", f"build-dir={Path(args.build_dir).resolve()}"]
        run("pip install ./python", pip, tmp / "pip.log", cwd=ROOT, env=env, timeout=900)

        elsewhere = tmp / "elsewhere"
        elsewhere.mkdir()
        nobody = tmp / "nobody-listens.sock"
        out = run("import and connect", [str(python), "-I", "-c", CHILD, str(nobody)],
                  tmp / "child.log", cwd=elsewhere, env={"PATH": SYSTEM_PATH}, timeout=120)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(got, indent=1))

        site = Path(subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
            capture_output=True, text=True, check=True, timeout=60).stdout.strip()).resolve()
        bundled = site / "kvnode" / "_native" / "libkvnode_client.so"
        if Path(got["kvnode"]).resolve() != site / "kvnode" / "__init__.py":
            fail(f"kvnode imported from {got['kvnode']}, not the venv's {site}")
        if not Path(got["numpy"]).resolve().is_relative_to(site):
            fail(f"numpy imported from {got['numpy']}, not installed in the venv as a dependency")
        if not set(got["env"]) <= {"PATH", "LC_CTYPE"}:  # LC_CTYPE: Python's C-locale coercion
            fail(f"the child's environment was not clean: {got['env']}")
        if Path(got["lib"]).resolve() != bundled:
            fail(f"loaded {got['lib']}, not the bundled {bundled}")
        if [str(Path(p).resolve()) for p in got["mapped"]] != [str(bundled)]:
            fail(f"mapped libraries {got['mapped']}, not the bundled {bundled} alone")
        natives = sorted(p.name for p in bundled.parent.iterdir())
        if natives != ["libkvnode_client.so"]:
            fail(f"kvnode/_native holds {natives}: one library file expected")
        error = got["error"]
        if not error:
            fail("connect() to a path where nothing listens did not raise kvnode.Error")
        if error["status"] != "not_found" or error["code"] != -2 \
                or str(nobody) not in error["message"]:
            fail(f"connect() raised {error}: want status not_found (-2) naming {nobody}")

        if shutil.which("readelf"):
            dynamic = subprocess.run(["readelf", "-d", str(bundled)], capture_output=True,
                                     text=True, check=True, timeout=60).stdout
            if "RPATH" in dynamic or "RUNPATH" in dynamic:
                fail(f"{bundled} carries a run path:\n{dynamic}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if git:
        left = new_files() - before
        if left:
            fail(f"pip install ./python left files in the source tree: {sorted(left)}")
    print(f"python_install passed in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
