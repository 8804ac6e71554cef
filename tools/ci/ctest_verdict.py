"""The verdict of one run-ctest.sh run, from ctest's exit status and machine-readable results.

Reads RESULTS/first.xml (JUnit), RESULTS/first-failed.txt (ctest's LastTestsFailed.log, names
only) and, when a rerun happened, RESULTS/rerun.xml. Writes RESULTS/counts
("passed=N failed=N skipped=N"), prints a closing "ctest: N passed, N failed, N skipped" line and
exits 0 only when at least one test ran and none failed. A test that passed only on its rerun
counts as failed unless the known-flakes file names it (a regex on the full test name, a date,
a cause, separated by spaces).
"""

import argparse
import pathlib
import re
import sys
import xml.etree.ElementTree as ET


def statuses(path):
    """{test name: JUnit status} ('run', 'fail', 'notrun', 'disabled'); {} when absent."""
    if not path.is_file():
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        print(f"== ctest: unreadable JUnit file {path}: {err}")
        return {}
    return {case.get("name"): case.get("status", "") for case in root.iter("testcase")}


def known_flakes(path, problems):
    """[(regex, date, cause)] from lines 'REGEX YYYY-MM-DD cause' (the regex has no spaces);
    '#' starts a comment. A malformed line is a problem of the run, not a crash."""
    flakes = []
    if not path.is_file():
        return flakes
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        try:
            if len(parts) != 3 or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", parts[1]):
                raise ValueError("expected 'REGEX YYYY-MM-DD cause'")
            flakes.append((re.compile(parts[0]), parts[1], parts[2]))
        except (ValueError, re.error) as err:
            problems.append(f"{path}:{number}: {err}: {line}")
    return flakes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", type=pathlib.Path, required=True)
    parser.add_argument("--first-rc", type=int, required=True)
    parser.add_argument("--rerun-rc", type=int, default=0)
    parser.add_argument("--known-flakes", type=pathlib.Path, required=True)
    args = parser.parse_args()

    first = statuses(args.results / "first.xml")
    failed_file = args.results / "first-failed.txt"
    named_failed = set(failed_file.read_text().split()) if failed_file.is_file() else set()
    failed = named_failed | {name for name, status in first.items() if status == "fail"}
    passed = {name for name, status in first.items() if status == "run"} - failed
    skipped = set(first) - failed - passed

    problems = []
    rerun = statuses(args.results / "rerun.xml")
    recovered = {name for name in failed if rerun.get(name) == "run"}
    flakes = known_flakes(args.known_flakes, problems)
    for name in sorted(recovered):
        match = next((flake for flake in flakes if flake[0].fullmatch(name)), None)
        if match:
            print(f"== ctest: {name} passed on its second run: known flake ({match[1]}: {match[2]})")
            failed.discard(name)
            passed.add(name)
        else:
            print(f"== ctest: {name} passed only on its second run and is no known flake "
                  f"({args.known_flakes.name}): counted as failed")

    if not first:
        problems.append("no tests were found (or ctest wrote no results)")
    if args.first_rc != 0 and not named_failed and not failed:
        problems.append(f"ctest exited {args.first_rc} without naming a failed test")
    for name in sorted(failed):
        print(f"== ctest: FAILED {name}")

    (args.results / "counts").write_text(
        f"passed={len(passed)} failed={len(failed)} skipped={len(skipped)}\n")
    for problem in problems:
        print(f"== ctest: {problem}")
    print(f"ctest: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 0 if not failed and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
