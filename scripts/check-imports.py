#!/usr/bin/env python3
"""Package.swift declares exactly what each target imports: no module imported without being
declared (it builds only by luck of the build order), none declared and never imported (it
links and builds for nothing). Reads `swift package dump-package` and the `import` lines of
each target's files. Usage: python3 scripts/check-imports.py (exit 1 and a list when not so)."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Modules that come with the toolchain or the system, never declared in Package.swift.
SYSTEM = {
    "Foundation", "FoundationEssentials", "FoundationNetworking", "Dispatch", "Glibc", "Musl",
    "Synchronization", "Testing", "XCTest", "_Concurrency", "Darwin", "os", "Observation",
    "_StringProcessing", "RegexBuilder", "Swift",
}
# Column 0 only: an indented "import json" is a Python snippet inside a Swift string.
IMPORT = re.compile(r"^(?:@[\w]+(?:\([^)]*\))?\s+)*(?:public |package |internal |private |fileprivate )?import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?([A-Za-z_][A-Za-z0-9_]*)", re.M)


def main() -> int:
    package = json.loads(subprocess.run(["swift", "package", "dump-package"], cwd=ROOT, check=True,
                                        capture_output=True, text=True).stdout)
    # A test declares an executable to have it built, and runs it: never imported.
    executables = {target["name"] for target in package["targets"] if target["type"] == "executable"}
    problems = []
    for target in package["targets"]:
        name, kind = target["name"], target["type"]
        if kind in ("system", "binary", "plugin", "macro"):
            continue
        path = target.get("path") or os.path.join("Tests" if kind == "test" else "Sources", name)
        folder = os.path.join(ROOT, path)
        declared = set()  # every product this package uses is named after its module
        for dependency in target.get("dependencies", []):
            for key in ("byName", "target", "product"):
                if key in dependency:
                    declared.add(dependency[key][0])
        imported = set()
        for directory, _, files in os.walk(folder):
            for file in files:
                if file.endswith(".swift"):
                    with open(os.path.join(directory, file), encoding="utf-8") as handle:
                        imported |= set(IMPORT.findall(handle.read()))
                elif file.endswith((".c", ".h")):
                    with open(os.path.join(directory, file), encoding="utf-8") as handle:
                        text = handle.read()
                    if "<sqlite3.h>" in text:
                        imported.add("GRDBSQLite")
        if not any(f.endswith(".swift") for _, _, fs in os.walk(folder) for f in fs):
            # A C target: only its SQLite header is checked.
            missing = {"GRDBSQLite"} & imported - declared
            unused = set()
        else:
            missing = imported - declared - SYSTEM - {name}
            unused = declared - imported - executables
        for module in sorted(missing):
            problems.append(f"{name}: imports {module}, which Package.swift does not declare")
        for module in sorted(unused):
            problems.append(f"{name}: declares {module}, which none of its files imports")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
