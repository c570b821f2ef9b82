#!/bin/bash
# Builds and runs userstored in the foreground on the repository's own default configuration
# (config/userstored.yaml: data in .run/data, socket at .run/userstore.sock). Installs what it
# needs first. Ctrl-C stops it gracefully.
# Usage: bash scripts/run.sh [--s3] [userstored arguments]
#   --s3  replicate every store to a local S3 API (SeaweedFS on 127.0.0.1:8333, scripts/s3.sh),
#         through the daemon's own log; `bash scripts/s3.sh stop` ends the S3 server.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
# Only what running needs; --s3 also needs the S3 server of the test stack.
if [ "${1:-}" = "--s3" ]; then bash scripts/install-deps.sh; else bash scripts/install-deps.sh run; fi
swift build --product userstored
swift build --product userstorectl
if [ "${1:-}" = "--s3" ]; then
    shift
    eval "$(bash scripts/s3.sh start)"
    echo "userstored: replicating to $USERSTORED_REPLICATION_REPLICA" >&2
fi
exec .build/debug/userstored --config config/userstored.yaml "$@"
