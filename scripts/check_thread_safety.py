#!/usr/bin/env python3
"""clang's lock checking over the whole control plane.

Every translation unit of common/, coordinator/, worker/agent/ and client/ in the
build's compile_commands.json is compiled with `clang++ -fsyntax-only -Wthread-safety
-Werror`, so a violated lock annotation (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
...) or any clang warning fails. A unit that a build compiled with
-Wthread-safety -Werror into an object newer than the source has passed the same
check and is not compiled again here: under clang the main build compiles every unit
of those folders so (decision 184), the clang fuzz sub-build common/ and the
coordinator's core; gcc cannot check the annotations. ctest runs this as
`thread_safety_check` (label lint).

    scripts/check_thread_safety.py [BUILD_DIR]     (default: build)
"""
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys

LAYERS = ("common/", "coordinator/", "worker/agent/", "client/")


def clang_command(command):
    """The gcc command with the compiler swapped and its -o and -c dropped."""
    args = shlex.split(command)
    out = ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror"]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = True
        else:
            out.append(a)
    return out


def checked_by_build(entries):
    """The sources a build (the main one under clang, the fuzz sub-build) compiled,
    by its compile_commands.json `entries`, with -Wthread-safety and -Werror (every
    warning an error) into an object newer than the source."""
    out = set()
    for entry in entries:
        args = shlex.split(entry["command"])
        if "-Werror" not in args or "-Wthread-safety" not in args or "-o" not in args:
            continue
        obj = os.path.join(entry["directory"], args[args.index("-o") + 1])
        src = os.path.join(entry["directory"], entry["file"])
        if os.path.isfile(obj) and os.path.getmtime(obj) >= os.path.getmtime(src):
            out.add(os.path.realpath(src))
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build")
    db = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db):
        print(f"no {db}: configure the build first", file=sys.stderr)
        return 2
    if shutil.which("clang++") is None:
        print("clang++ is missing (scripts/install_deps.sh installs it)", file=sys.stderr)
        return 2
    fuzz_db = os.path.join(build, "fuzz", "compile_commands.json")
    fuzz_checked = checked_by_build(json.load(open(fuzz_db)) if os.path.isfile(fuzz_db) else [])
    entries = json.load(open(db))
    built_checked = checked_by_build(entries)
    units, skipped, built = [], 0, 0
    for entry in entries:
        rel = os.path.relpath(entry["file"], root)
        if not rel.startswith(LAYERS):
            continue
        if os.path.realpath(entry["file"]) in built_checked:
            built += 1
            continue
        if os.path.realpath(entry["file"]) in fuzz_checked:
            skipped += 1
            continue
        units.append((rel, entry["directory"], clang_command(entry["command"]) + [entry["file"]]))

    def check(unit):
        rel, directory, cmd = unit
        done = subprocess.run(cmd, cwd=directory, capture_output=True, text=True)
        return rel, done.returncode, done.stdout + done.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for rel, rc, output in pool.map(check, sorted(units)):
            if rc != 0:
                failed.append(rel)
                print(output, end="")
    print(f"thread-safety check: {len(units)} translation units of {', '.join(LAYERS)} "
          f"({built} more passed it in this build, {skipped} in the clang fuzz build); "
          f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}")
    return 1 if failed or not (units or skipped or built) else 0


if __name__ == "__main__":
    sys.exit(main())
