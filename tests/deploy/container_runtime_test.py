#!/usr/bin/env python3
"""The container image's runtime packages cover what its binaries link.

    container_runtime_test.py BIN_DIR CONTAINERFILE

deploy/container/Containerfile's `cpu` stage installs a list of Debian runtime packages
and copies ddp-coordinator, ddp-worker, ddp-trainer and ddpctl built in the `build-cpu`
stage (Debian 12, as this machine). No container engine runs here, so this checks what
an engine would find missing at the first start: every shared library each binary
needs directly (readelf's NEEDED) must come, by dpkg's record of who ships its file,
from a listed package, from what those depend on (apt-cache's recursive Depends and
Pre-Depends), or from a package every Debian image has (Priority: required). A
library found outside Debian's packages fails too: the image would not have it.
Exit 77 (skipped) without readelf, dpkg or apt-cache.
"""
import os
import re
import shutil
import subprocess
import sys

BINARIES = ["ddp-coordinator", "ddp-worker", "ddp-trainer", "ddpctl"]


def run(argv):
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def stage_packages(containerfile, stage):
    """The packages the stage's `apt-get install` names."""
    text = open(containerfile).read()
    m = re.search(r"^FROM \S+ AS %s\n(.*?)(?=^FROM |\Z)" % re.escape(stage), text, re.M | re.S)
    if not m:
        sys.exit("%s: no stage named %s" % (containerfile, stage))
    body = m.group(1).replace("\\\n", " ")
    install = re.search(r"apt-get install ([^&\n]*)", body)
    if not install:
        sys.exit("%s: stage %s installs no packages" % (containerfile, stage))
    return [w for w in install.group(1).split() if not w.startswith("-")]


def closure(packages):
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + packages)
    names = set(packages)
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"^\|?(?:Pre)?Depends: (\S+)", line)
        if m and not m.group(1).startswith("<"):
            names.add(m.group(1).split(":")[0])
        elif line and not line.startswith(("|", "Depends", "PreDepends", "<")) and ":" not in line:
            names.add(line)
    return names


def required_packages():
    out = run(["dpkg-query", "-W", "-f", "${Package} ${Priority}\n"])
    return {p for p, prio in (l.split(" ", 1) for l in out.splitlines() if " " in l)
            if prio in ("required",)}


def needed_libraries(binary):
    """(soname, resolved path or None) of the binary's direct NEEDED entries."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", binary]))
    resolved = {}
    for line in run(["ldd", binary]).splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            resolved[m.group(1)] = m.group(2) if m.group(2) != "not" else None
    return [(soname, resolved.get(soname)) for soname in needed]


def owners(paths):
    """{path: package} for the files dpkg knows, asked in one call (a library's
    symlink, its target, and the /lib spelling of /usr/lib: merged-/usr systems record
    either)."""
    spellings = {}
    for path in paths:
        for candidate in (path, os.path.realpath(path)):
            for p in (candidate, candidate.replace("/usr/lib/", "/lib/", 1)):
                spellings.setdefault(p, path)
    r = subprocess.run(["dpkg", "-S"] + sorted(spellings), capture_output=True, text=True)
    found = {}
    for line in r.stdout.splitlines():
        package, _, file = line.partition(": ")
        if file in spellings:
            found.setdefault(spellings[file], package.split(":")[0].split(",")[0].strip())
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    bin_dir, containerfile = sys.argv[1:]
    for tool in ("readelf", "dpkg", "apt-cache", "ldd"):
        if shutil.which(tool) is None:
            print("skipped: no %s" % tool)
            return 77
    listed = stage_packages(containerfile, "cpu")
    have = closure(listed) | required_packages()
    problems = []
    checked = 0
    needs = []  # (binary, soname, path)
    for name in BINARIES:
        binary = os.path.join(bin_dir, name)
        if not os.path.exists(binary):
            problems.append("%s is missing: build it first" % binary)
            continue
        for soname, path in needed_libraries(binary):
            checked += 1
            if path is None:
                problems.append("%s: %s is not found on this machine" % (name, soname))
            else:
                needs.append((name, soname, path))
    found = owners({path for _, _, path in needs})
    for name, soname, path in needs:
        package = found.get(path)
        if package is None:
            problems.append("%s: %s (%s) belongs to no Debian package: the image would "
                            "not have it" % (name, soname, path))
        elif package not in have:
            problems.append("%s needs %s, shipped by %s, which the cpu stage neither "
                            "installs nor gets through its packages' dependencies: add "
                            "it to the stage's apt-get install" % (name, soname, package))
    print("cpu stage: %d packages listed, %d with their dependencies; %d libraries checked"
          % (len(listed), len(have), checked))
    if problems:
        print("\n".join(sorted(set(problems))))
        return 1
    print("every library the binaries need comes with the image's packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
