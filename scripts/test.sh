#!/bin/bash
# Runs every test (unit and integration, against real files, sockets, processes and systemd
# components). Installs what it needs first. Usage: bash scripts/test.sh [swift test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh
swift build --build-tests
swift test "$@"
