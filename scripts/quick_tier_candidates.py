"""Which default-suite tests the quick check could hand to the slow tier without losing a covered line.

Reads a coverage file recorded with per-test contexts and the same run's JUnit XML (its per-test times), for example
    scripts/measure_tests.sh OUT.txt -n 2 --dist loadfile -m "not slow and not gpu and not trt" \
        --cov-context=test --junitxml=junit.xml
    python scripts/quick_tier_candidates.py .coverage junit.xml [--min-seconds 2]
and walks the test functions from the most expensive down: a function (all its parametrized cases together) is a
candidate when every line it covers is still covered by the functions kept so far or at import and collection time.
Lines a test reaches only through a subprocess it starts are not seen here unless coverage follows subprocesses, so
the candidates are where to look, not a verdict: the split itself is the ``slow`` marks in the tests.
"""

from __future__ import annotations

import argparse
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from coverage import CoverageData


def function_id(nodeid: str) -> str:
    """``tests/x.py::test_f[a-b]`` -> ``tests/x.py::test_f`` (every parametrized case of one function together)."""
    return re.sub(r"\[.*\]$", "", nodeid)


def junit_seconds(path: Path) -> dict[str, float]:
    """Per test function: the summed setup + call + teardown seconds of its cases, keyed like coverage's contexts."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        name = case.get("name", "")
        # classname is the module's dotted path, then any test classes; find where the file ends
        for cut in range(len(parts), 0, -1):
            if Path("/".join(parts[:cut]) + ".py").is_file():
                nodeid = "/".join(parts[:cut]) + ".py::" + "::".join([*parts[cut:], name])
                break
        else:
            continue
        seconds[function_id(nodeid)] += float(case.get("time", 0))
    return seconds


def lines_per_function(coverage_file: Path) -> tuple[dict[str, set[tuple[str, int]]], set[tuple[str, int]]]:
    """Per test function, the (file, line) pairs its cases ran; and every line any context ran."""
    data = CoverageData(str(coverage_file))
    data.read()
    per_test: dict[str, set[tuple[str, int]]] = defaultdict(set)
    everything: set[tuple[str, int]] = set()
    for measured in data.measured_files():
        for line, contexts in data.contexts_by_lineno(measured).items():
            everything.add((measured, line))
            for context in contexts:
                if context:  # "" is import and collection time: every run of the suite covers it
                    per_test[function_id(context.rsplit("|", 1)[0])].add((measured, line))
                else:
                    per_test[""].add((measured, line))
    return per_test, everything


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("coverage_file", type=Path)
    parser.add_argument("junit_xml", type=Path)
    parser.add_argument("--min-seconds", type=float, default=2.0, help="never hand over a function cheaper than this")
    args = parser.parse_args()

    per_test, everything = lines_per_function(args.coverage_file)
    seconds = junit_seconds(args.junit_xml)
    baseline = per_test.pop("", set())  # covered whatever tests run: no test needs to hold these
    per_test = {name: lines - baseline for name, lines in per_test.items() if name in seconds}  # this run's tests only
    holders: dict[tuple[str, int], int] = defaultdict(int)
    for lines in per_test.values():
        for line in lines:
            holders[line] += 1

    handed, kept_seconds = [], 0.0
    for name in sorted(seconds, key=seconds.get, reverse=True):
        lines = per_test.get(name, set())
        if seconds[name] >= args.min_seconds and all(holders[line] > 1 for line in lines):
            for line in lines:
                holders[line] -= 1
            handed.append(name)
        else:
            kept_seconds += seconds[name]
    total = sum(seconds.values())
    print(f"# {len(everything)} lines run (coverage's line records); {len(seconds)} test functions, {total:.0f} s of test time")
    print(f"# candidates: {len(handed)} functions, {total - kept_seconds:.0f} s; kept: {kept_seconds:.0f} s")
    for name in handed:
        print(f"{seconds[name]:8.1f}  {name}")


if __name__ == "__main__":
    main()
