#!/bin/bash
# Builds and runs userstored in the foreground on the repository's own default configuration
# (config/userstored.yaml: data in .run/data, socket at .run/userstore.sock). Installs what it
# needs first. Ctrl-C stops it gracefully. Usage: bash scripts/run.sh [userstored arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh
swift build --product userstored
swift build --product userstorectl 2>/dev/null || true
exec .build/debug/userstored --config config/userstored.yaml "$@"
