#!/bin/bash
# make crash-s3: scripts/crash-loop.py with the daemon's own log (replication.engine: log) on a
# local SeaweedFS, every write durable, KILLS SIGKILLs (default 1000), then the disk lost and
# every store restored from the bucket. Prints the summary; exits 1 if an acknowledged write is
# missing. Usage: bash scripts/crash-s3.sh [KILLS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh >/dev/null
swift build -c release --static-swift-stdlib --product userstored
export USERSTORE_S3_PORT=8633
eval "$(bash scripts/s3.sh start)"
# s3.sh exports the development replica for the daemon; this run names its own prefix.
unset USERSTORED_REPLICATION_REPLICA
trap 'bash scripts/s3.sh stop >/dev/null 2>&1 || true' EXIT
replica="s3://userstore/crash-$$?endpoint=http://127.0.0.1:$USERSTORE_S3_PORT&region=us-east-1&forcePathStyle=true"
python3 scripts/crash-loop.py --daemon "$(swift build -c release --show-bin-path)/userstored" --kills "${1:-1000}" --replica "$replica"
