#!/usr/bin/env python3
"""The build targets that the tests ctest would pick need: each test's program and every
program or library of the build tree it names, in its command line or in its
REQUIRED_FILES property (tests/CMakeLists.txt declares there what a test script runs
that its arguments do not name). A build of these alone runs those tests, so a second
flavour builds only what it tests (scripts/run_tests.sh):

    cmake --build B --target $(scripts/ctest_targets.py B -L trainer)

Files of BUILD/bin/NAME are the target NAME, of BUILD/lib/libNAME.so* the target NAME.
Needs a configured build tree (ctest reads its CTestTestfile.cmake); the programs need
not be built yet.
"""
import json
import os
import re
import subprocess
import sys


def commands(build):
    """Every test's command line, from the CTestTestfile.cmake files (ctest's own JSON
    leaves out a command whose program is not built yet)."""
    add = re.compile(r"^add_test\(\[=\[(.+?)\]=\] (.*)\)$")
    quoted = re.compile(r'"((?:[^"\\]|\\.)*)"')
    out = {}
    for dirpath, _, files in os.walk(build):
        if "CTestTestfile.cmake" not in files:
            continue
        with open(os.path.join(dirpath, "CTestTestfile.cmake")) as f:
            for line in f:
                m = add.match(line.strip())
                if m:
                    out[m.group(1)] = quoted.findall(m.group(2))
    return out


def targets(build, ctest_args):
    build = os.path.realpath(build)
    out = subprocess.run(["ctest", "--show-only=json-v1", *ctest_args], cwd=build,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("ctest_targets.py: ctest --show-only in %s failed: %s" % (build, out.stderr))
    lines = commands(build)
    names = set()
    lib = re.compile(r"^lib(.+?)\.so(\..*)?$")
    for test in json.loads(out.stdout).get("tests", []):
        files = list(lines.get(test["name"], test.get("command") or []))
        for prop in test.get("properties", []):
            if prop.get("name") == "REQUIRED_FILES":
                files += prop.get("value", [])
        for f in files:
            path = os.path.realpath(f) if os.path.isabs(f) else ""
            if os.path.dirname(path) == os.path.join(build, "bin"):
                names.add(os.path.basename(path))
            elif os.path.dirname(path) == os.path.join(build, "lib"):
                m = lib.match(os.path.basename(path))
                if m:
                    names.add(m.group(1))
    return sorted(names)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ctest_targets.py BUILD_DIR [ctest selection args...]")
    print(" ".join(targets(sys.argv[1], sys.argv[2:])))


if __name__ == "__main__":
    main()
