#!/bin/bash
# make churn: a release build of the daemon, then scripts/churn.py — 100,000 users through
# maxOpenStores 1,024 replicating to SeaweedFS, the disk lost, 1,000 users restored (issue #38;
# its figures go in docs/bench/). About 20 minutes here; not part of make test.
#   bash scripts/churn.sh [--users N] [--revisits F] [--workers N] [--sample N] [--json FILE] [--inspect]
#   (--inspect: before the daemon stops, where its memory is: smaps, malloc_info, RSS after malloc_trim; needs gdb)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh
swift build -c release --static-swift-stdlib --product userstored >/dev/null # as make bench builds it: one release build for both
bin="$(swift build -c release --show-bin-path)"
# Litestream 0.5.17's S3 client fails with AWS_CA_BUNDLE set (the daemon builds Litestream's
# environment itself; this keeps boto3-free tools of the run from inheriting it too).
unset AWS_CA_BUNDLE
exec .build/testenv/bin/python3 scripts/churn.py --daemon "$bin/userstored" "$@"
