#!/usr/bin/env bash
# Builds everything (scripts/build.sh), runs every C++ test with CTest, then the
# Python package's tests (scripts/test-python.sh: pip install . into .venv,
# reusing build/'s library, then pytest tests/python). GPU tests skip where no
# GPU is visible; torch tests where torch is not installed.
#
# The full output goes to build/test-logs/: build.log, ctest.log (with
# ctest-junit.xml and ctest-tests.json, what the summary is counted from),
# pip-install.log, pytest.log (with pytest-junit.xml). Printed: the build's
# summary lines and, at the end, one line per suite counting passed, failed
# and skipped tests (with why they skipped), the failing tests' names, and
# where the logs are. The exit code is non-zero when anything failed.
# CUFLASH_TEST_PRINT_LOGS=1 (.ci/run sets it) also prints a failed step's log
# in full, for CI, where build/ is not kept.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

logs=build/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.log "$logs"/*.xml "$logs"/*.json
print_log() {  # <log file>: in full, when asked to
  if [ "${CUFLASH_TEST_PRINT_LOGS:-0}" = 1 ]; then
    echo "----- $1 -----"
    cat "$1"
    echo "----- end of $1 -----"
  fi
}

echo "test: building (scripts/build.sh; log: $logs/build.log)"
if ! ./scripts/build.sh >"$logs/build.log" 2>&1; then
  tail -n 40 "$logs/build.log"
  print_log "$logs/build.log"
  echo "test: the build failed; full log: $logs/build.log"
  exit 1
fi
grep '^cuflash: ' "$logs/build.log" | sed 's/^/test: /'

status=0
echo "test: C++ tests (ctest; log: $logs/ctest.log)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --output-junit "$PWD/$logs/ctest-junit.xml" \
  >"$logs/ctest.log" 2>&1 || status=1
ctest --test-dir build --show-only=json-v1 >"$logs/ctest-tests.json" 2>/dev/null || true
[ "$status" -eq 0 ] || print_log "$logs/ctest.log"

echo "test: generated sources are current (scripts/gen_wgmma.py, scripts/gen_kernel_table.py --check)"
python3 scripts/gen_wgmma.py --check || status=1
python3 scripts/gen_kernel_table.py --check || status=1

echo "test: Python tests (scripts/test-python.sh)"
python_status=0
CUFLASH_TEST_LOG_DIR=$logs ./scripts/test-python.sh || python_status=$?
if [ "$python_status" -ne 0 ]; then
  status=1
  for log in "$logs/pip-install.log" "$logs/pytest.log"; do [ -f "$log" ] && print_log "$log"; done
fi

# One line per suite from the JUnit files: GPU tests are the CTest tests labelled
# gpu; skip reasons are GTEST_SKIP's message (the line after "Skipped" in the
# test's output) or pytest's.
python3 - "$logs" <<'EOF' || status=1
import ast, collections, json, os, sys
import xml.etree.ElementTree as ET

logs = sys.argv[1]

def cases(path):
    if not os.path.exists(path):
        return None
    try:
        return list(ET.parse(path).getroot().iter("testcase"))
    except ET.ParseError:
        return None

def gtest_skip_reason(case):
    out = (case.findtext("system-out") or "").splitlines()
    for i, line in enumerate(out):
        if line.endswith(": Skipped") and i + 1 < len(out) and out[i + 1].strip():
            return out[i + 1].strip()
    return "skipped"

def pytest_skip_reason(case):
    skip = case.find("skipped")
    message = skip.get("message", "skipped")
    if message == "collection skipped":  # a whole module; its text is repr((path, line, "Skipped: why"))
        try:
            _, _, why = ast.literal_eval(skip.text or "")
            return f"{why.removeprefix('Skipped: ')} (each a whole module)"
        except (ValueError, SyntaxError, TypeError):
            pass
    return message

def reasons(counter):
    return "; ".join(f"{n} {why}" for why, n in counter.most_common())

failed_names = []

def suite_line(name, testcases, reason_of, gpu_names=frozenset()):
    passed, failed, gpu_skips, other_skips = 0, [], collections.Counter(), collections.Counter()
    for case in testcases:
        skip = case.find("skipped")
        # CTest: a test skipped through SKIP_REGULAR_EXPRESSION is "notrun" with that message;
        # other "notrun" tests (a missing executable, say) count as failed, as CTest counts them.
        if name == "C++" and skip is not None and case.get("status") == "notrun":
            if skip.get("message") != "SKIP_REGULAR_EXPRESSION_MATCHED":
                skip = None
                case.append(ET.Element("failure"))
        if case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
            failed.append(case.get("name") if name == "C++" else f"{case.get('classname')}::{case.get('name')}")
        elif skip is not None or case.get("status") == "disabled":
            why = reason_of(case) if skip is not None else "disabled"
            (gpu_skips if case.get("name") in gpu_names else other_skips)[why] += 1
        else:
            passed += 1
    skipped = sum(gpu_skips.values()) + sum(other_skips.values())
    text = f"{name} {len(testcases)}: {passed} passed, {len(failed)} failed, {skipped} skipped"
    parts = []
    if gpu_skips:
        parts.append(f"{sum(gpu_skips.values())} GPU tests: {reasons(gpu_skips)}")
    if other_skips:
        parts.append(reasons(other_skips))
    if parts:
        text += " (" + "; ".join(parts) + ")"
    failed_names.extend(f"{name}: {n}" for n in failed)
    return text

ctest_cases = cases(f"{logs}/ctest-junit.xml")
gpu_names = set()
try:
    with open(f"{logs}/ctest-tests.json") as f:
        for test in json.load(f).get("tests", []):
            for prop in test.get("properties", []):
                if prop.get("name") == "LABELS" and "gpu" in prop.get("value", []):
                    gpu_names.add(test["name"])
except (OSError, ValueError):
    pass
lines = []
if ctest_cases is None:
    lines.append(f"C++: no results (see {logs}/ctest.log)")
else:
    lines.append(suite_line("C++", ctest_cases, gtest_skip_reason, gpu_names))
py_cases = cases(f"{logs}/pytest-junit.xml")
if py_cases is None:
    lines.append(f"Python: no results (see {logs}/pip-install.log and {logs}/pytest.log)")
else:
    lines.append(suite_line("Python", py_cases, pytest_skip_reason))
for line in lines:
    print(f"tests: {line}")
if failed_names:
    shown = failed_names[:30]
    print("tests: FAILED " + ", ".join(shown) + (f" and {len(failed_names) - len(shown)} more" if len(failed_names) > len(shown) else ""))
print(f"tests: full logs in {logs}/ (build.log, ctest.log, pip-install.log, pytest.log)")
sys.exit(1 if failed_names or ctest_cases is None or py_cases is None else 0)
EOF
exit $status
