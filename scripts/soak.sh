#!/bin/bash
# make soak: a release build of the daemon and the C load generator, then scripts/soak.py
# (10 minutes at about half of capacity; its figures go in docs/reliability.md).
#   bash scripts/soak.sh [--minutes N] [--fraction F] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh
swift build -c release --product userstored >/dev/null
bin="$(swift build -c release --show-bin-path)"
cc -O2 -Wall -pthread -o "$bin/userstore-load" bench/userstore-load.c
exec python3 scripts/soak.py --daemon "$bin/userstored" --load "$bin/userstore-load" "$@"
