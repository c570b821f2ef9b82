#!/bin/bash
# make bench: builds in release mode and runs every scenario against its baseline in the same
# run (installs PostgreSQL 15 and sqlite3 from Debian). Prints a markdown table; writes JSON to
# docs/bench/latest.json (a narrowed run: .build/bench-partial.json; --json FILE to choose).
# Usage: bash scripts/bench.sh [--quick] [--only 1,4] [--seconds 5] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh
if ! dpkg-query -W -f='${Status}' postgresql-15 2>/dev/null | grep -q "install ok installed"; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 postgresql-client-15 >/dev/null
fi
# The fleet scenario also runs on a journaled ext4 and an XFS made in loop images (mkfs.ext4
# comes with e2fsprogs; mkfs.xfs with xfsprogs).
command -v mkfs.xfs >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xfsprogs >/dev/null || true
# The packaged cluster is not needed: the benchmark starts its own on a private socket.
pg_ctlcluster 15 main stop 2>/dev/null || true
swift build -c release --static-swift-stdlib --product userstored
swift build -c release --static-swift-stdlib --product userstorectl
swift build -c release --static-swift-stdlib --product userstore-bench
command -v cc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
# The load generator is C, as lean as pgbench (bench/userstore-load.c).
bin="$(swift build -c release --show-bin-path)"
cc -O2 -Wall -pthread -o "$bin/userstore-load" bench/userstore-load.c
# The machine's floor for a varlink server, driven by the same client: bench/userstore-floor.c.
cc -O2 -Wall -pthread -o "$bin/userstore-floor" bench/userstore-floor.c
# What SQLite alone allows a fleet migration (scenario 4), also C: bench/userstore-fleet-floor.c.
cc -O2 -Wall -pthread -o "$bin/userstore-fleet-floor" bench/userstore-fleet-floor.c -lsqlite3
# What SQLite alone allows a point query on the same files (scenario 1): bench/userstore-sqlite-floor.c.
cc -O2 -Wall -pthread -o "$bin/userstore-sqlite-floor" bench/userstore-sqlite-floor.c -lsqlite3
exec "$bin/userstore-bench" --repository "$PWD" "$@"
