#!/bin/bash
# Writes the man pages into OUT: userstorectl(1) and one page per subcommand, userstored(8) —
# generated from the binaries' own --help (ArgumentParser's generate-manual tool, so they never
# drift from it) — and userstored.yaml(5) from docs/configuration.md's tables (every key is
# there: ConfigurationKeyTests checks it against the daemon's one list of keys).
# Usage: bash scripts/manpages.sh BIN_DIR OUT   (BIN_DIR holds userstored and userstorectl)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bin="$1"
out="$2"
rm -rf "$out"
mkdir -p "$out"
# generate-manual is an executable of swift-argument-parser (the version Package.swift resolved);
# built from a copy, so the checkout SwiftPM manages stays untouched.
source=".build/checkouts/swift-argument-parser"
[ -d "$source" ] || swift package resolve
tool_package=".build/generate-manual"
if [ ! -x "$tool_package/.build/release/generate-manual" ] || [ "$source/Package.swift" -nt "$tool_package/Package.swift" ]; then
    rm -rf "$tool_package"
    mkdir -p "$tool_package"
    (cd "$source" && tar --exclude=.build --exclude=.git -cf - .) | (cd "$tool_package" && tar -xf -)
    swift build -c release --package-path "$tool_package" --product generate-manual >/dev/null
fi
tool="$tool_package/.build/release/generate-manual"
# The date of the commit, so a rebuild of the same tree gives the same pages.
date="$(git log -1 --format=%cs 2>/dev/null || date +%F)"
authors="userstore team<userstore@localhost>"
"$tool" "$bin/userstorectl" --multi-page --section 1 --date "$date" --authors "$authors" --output-directory "$out"
"$tool" "$bin/userstored" --section 8 --date "$date" --authors "$authors" --output-directory "$out"
# A subcommand's page is named as git names its own (git-commit(1) for `git commit`):
# userstorectl-migrate(1), its NAME line userstorectl-migrate, its synopsis `userstorectl migrate`.
# Empty lines are dropped (in roff they are blank output lines, not paragraph breaks).
for page in "$out"/userstorectl.*.1; do
    [ -e "$page" ] || continue
    base="$(basename "$page" .1)"
    name="${base//./-}"
    words="${base//./ }"
    sed -e "s|^\\.Dt [^ ]* |.Dt ${name^^} |" -e "s|^\\.Nm \"$words\"\$|.Nm $name|" -e "0,/^\\.Nm\$/s||.Nm \"$words\"|" -e '/^$/d' "$page" > "$out/$name.1"
    rm "$page"
done
sed -i '/^$/d' "$out/userstorectl.1" "$out/userstored.8"
python3 scripts/config-manpage.py docs/configuration.md "$date" > "$out/userstored.yaml.5"
ls "$out"
