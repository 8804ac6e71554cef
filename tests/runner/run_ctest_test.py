"""Tests tools/ci/run-ctest.sh, the runner behind ./dev.sh test, with every cmake/ctest pair
found here (the one building this tree, the first on PATH, Debian's): a tiny fixture project in
which all tests pass, one fails, none exist, one passes only on its rerun (known flake or not)
and one cannot start. Each case checks the exit status and the closing counts.

  python3 run_ctest_test.py [CMAKE...]
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
RUNNER = HERE.parent.parent / "tools" / "ci" / "run-ctest.sh"

REAL_FLAKES = HERE.parent / "known-flakes.txt"

# case: (exit status 0?, passed, failed, skipped, known-flakes text; None: the repository's file)
CASES = {
    "pass-real-flakes": (True, 2, 0, 1, None),
    "pass-bad-flakes": (False, 2, 0, 1, "(unclosed 2026-12-07 a regex that does not compile\n"),
    "pass": (True, 2, 0, 1, ""),
    "fail": (False, 2, 1, 1, ""),
    "none": (False, 0, 0, 0, ""),
    "flaky": (False, 2, 1, 1, ""),
    "flaky-known": (True, 3, 0, 1, "fla.y 2026-12-07 fails the first time on purpose\n"),
    "missing": (False, 2, 1, 2, ""),
}


def real_cmake(candidate):
    """(cmake, ctest, version) behind a name that may be a shim, or None."""
    script = "message(\"${CMAKE_COMMAND};${CMAKE_CTEST_COMMAND};${CMAKE_VERSION}\")"
    with tempfile.NamedTemporaryFile("w", suffix=".cmake", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run([candidate, "-P", f.name], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    finally:
        os.unlink(f.name)
    cmake, ctest, version = out.stderr.strip().split(";")
    return cmake, ctest, version


def check(cmake, ctest, version, case, work):
    want_ok, want_passed, want_failed, want_skipped, flakes_text = CASES[case]
    build = work / f"{version}-{case}"
    flakes = work / f"{version}-{case}-flakes.txt"
    if flakes_text is None:
        flakes = REAL_FLAKES
    else:
        flakes.write_text(flakes_text)
    fixture_case = case.split("-")[0]
    subprocess.run([cmake, "-S", HERE / "fixture", "-B", build, f"-DCASE={fixture_case}"],
                   check=True, capture_output=True)
    run = subprocess.run([RUNNER, build, "--ctest", ctest, "--known-flakes", flakes],
                         capture_output=True, text=True)
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    want_line = f"ctest: {want_passed} passed, {want_failed} failed, {want_skipped} skipped"
    counts = (build / "ctest-results" / "counts").read_text().strip()
    want_counts = f"passed={want_passed} failed={want_failed} skipped={want_skipped}"
    problems = []
    if (run.returncode == 0) != want_ok:
        problems.append(f"exit status {run.returncode}, wanted {'0' if want_ok else 'non-zero'}")
    if last != want_line:
        problems.append(f"closing line {last!r}, wanted {want_line!r}")
    if counts != want_counts:
        problems.append(f"counts {counts!r}, wanted {want_counts!r}")
    status = "ok" if not problems else "FAIL: " + "; ".join(problems)
    print(f"cmake {version} {case:12} rc={run.returncode} {last!r}: {status}")
    if problems:
        print(run.stdout, run.stderr, sep="\n")
    return not problems


def main():
    candidates = sys.argv[1:] + [shutil.which("cmake") or "", "/usr/bin/cmake"]
    pairs = {}
    for candidate in filter(None, candidates):
        found = real_cmake(candidate)
        if found:
            pairs.setdefault(found[2], found)  # one pair per version
    if not pairs:
        print("no cmake found")
        return 1
    print("cmake versions under test: " + ", ".join(sorted(pairs)))
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for cmake, ctest, version in pairs.values():
            for case in CASES:
                ok &= check(cmake, ctest, version, case, pathlib.Path(tmp))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
