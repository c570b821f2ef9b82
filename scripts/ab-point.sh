#!/bin/bash
# Two userstored binaries on the same point-query load, alternating (A B A B ...), so that a
# change to the request path is judged against the binary before it in the same minutes on the
# same machine — these VMs drift by 2x from hour to hour. Drives both with the bench's C client
# (bench/userstore-load.c): 1, 8 and 64 connections one call at a time, and 8 connections in
# batches of 16 (as pgbench's pipeline mode), on USERS users x 10,000 rows.
#
# Usage: bash scripts/ab-point.sh OLD_USERSTORED NEW_USERSTORED
#   (make ab-point OLD=<rev> builds <rev> in a worktree and runs this against the current tree)
# Environment: USERS (100), SECONDS_PER_RUN (5), ROUNDS (2), WRITES (0; 1 adds rows of
#   single-row UPDATEs, each its own commit, at 8 and 64 connections), DURABLE (0; 1 replicates
#   both sides to a file:// replica of their own and adds the same UPDATEs as durable writes,
#   each replying once its commit is in the replica); CONFIG (YAML appended to both sides'
#   configurations: e.g. metrics on, `metrics: {listen: "unix:/tmp/m.sock"}`); for the new side only,
#   NEW_CONFIG (YAML appended to its configuration) and NEW_MIGRATION (SQL of a migration 0002
#   it loads): e.g. a staged release in force against none (`make ab-release`).
# Each side runs on its own copy of the same data.
set -euo pipefail
old=$1 new=$2
users=${USERS:-100} seconds=${SECONDS_PER_RUN:-5} rounds=${ROUNDS:-2}
cd "$(dirname "$0")/.."
load="$(swift build -c release --show-bin-path)/userstore-load"
cc -O2 -Wall -pthread -o "$load" bench/userstore-load.c
work=$(mktemp -d /tmp/ab-point.XXXXXX)
trap 'kill $(cat "$work"/pid 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/migrations"
echo "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL);" > "$work/migrations/0001_kv.sql"
cat > "$work/userstored.yaml" <<EOF
appVersion: "2.0.0"
dataDirectory: $work/data
socketPath: $work/userstore.sock
migrationsDirectory: $work/migrations
logTarget: stderr
maxOpenStores: 1024
EOF
if [ "${DURABLE:-0}" = 1 ]; then printf 'replication:\n  replica: file://%s/replica\n' "$work" >> "$work/userstored.yaml"; fi
if [ -n "${CONFIG:-}" ]; then echo "$CONFIG" >> "$work/userstored.yaml"; fi

start() { # binary [configuration]
    "$1" --config "${2:-$work/userstored.yaml}" 2>/dev/null & echo $! > "$work/pid"
    # Set-up, not a test: wait until the socket answers.
    for _ in $(seq 600); do
        python3 -c "import socket; s=socket.socket(socket.AF_UNIX); s.connect('$work/userstore.sock')" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "ab-point: $1 did not start" >&2; exit 1
}
stop() { kill "$(cat "$work/pid")"; while kill -0 "$(cat "$work/pid")" 2>/dev/null; do sleep 0.05; done; }
scan() { # one full read of every store
    PYTHONPATH=scripts python3 - "$work/userstore.sock" "$users" <<'PYEOF'
import sys
from varlink_client import call, connect
connection = connect(sys.argv[1])
for index in range(int(sys.argv[2])):
    reply = call(connection, "io.userstore.Store.Query", user="u%05d" % index, sql="SELECT sum(length(value)) FROM kv")
    assert "error" not in reply, reply
PYEOF
}
daemon_ticks() { awk '{print $14 + $15}' "/proc/$(cat "$work/pid")/stat"; } # user + system CPU, in clock ticks
run() { # label, load arguments... → label, req/s, p99 µs, the daemon's CPU µs per request
    local label=$1; shift
    local before; before=$(daemon_ticks)
    "$load" --socket "$work/userstore.sock" --threads 2 --seconds "$seconds" --users "$users" "$@" > "$work/run.json"
    python3 -c "import json,sys; r=json.loads(open('$work/run.json').read().splitlines()[-1]); assert r['errors'] == 0, ('$label', r)
print('$label', r['throughput'], r['p99_us'], ($(daemon_ticks) - $before) * 1e6 / $(getconf CLK_TCK) / r['requests'])"
}

# The users' stores, created and migrated by the new daemon, then filled directly.
start "$new"
PYTHONPATH=scripts python3 - "$work/userstore.sock" "$users" <<'EOF'
import sys
from varlink_client import call, connect
connection = connect(sys.argv[1])
for index in range(int(sys.argv[2])):
    reply = call(connection, "io.userstore.Store.Open", user="u%05d" % index)
    assert "error" not in reply, reply
EOF
stop
files=$(find "$work/data/stores" -name '*.sqlite')
[ "$(echo "$files" | wc -w)" = "$users" ] || { echo "ab-point: $users stores expected, found $(echo "$files" | wc -w)" >&2; exit 1; }
for file in $files; do
    sqlite3 "$file" "INSERT INTO kv (id, value) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000) SELECT x, 'value ' || x FROM c;"
done

# The new side's copy: its own data, migrations and configuration.
cp -a "$work/data" "$work/data-new"
cp -a "$work/migrations" "$work/migrations-new"
if [ -d "$work/replica" ]; then cp -a "$work/replica" "$work/replica-new"; fi
if [ -n "${NEW_MIGRATION:-}" ]; then echo "$NEW_MIGRATION" > "$work/migrations-new/0002_new.sql"; fi
sed -e "s|$work/data|$work/data-new|; s|$work/migrations|$work/migrations-new|; s|$work/replica|$work/replica-new|" "$work/userstored.yaml" > "$work/userstored-new.yaml"
if [ -n "${NEW_CONFIG:-}" ]; then echo "$NEW_CONFIG" >> "$work/userstored-new.yaml"; fi

results="$work/results"
for round in $(seq "$rounds"); do
    for side in old new; do
        binary=$old; config=$work/userstored.yaml
        [ "$side" = new ] && binary=$new && config=$work/userstored-new.yaml
        start "$binary" "$config"
        scan # warm: every store's pages in its cache, as SQLite alone and PostgreSQL are measured
        "$load" --socket "$work/userstore.sock" --connections 8 --threads 2 --seconds 2 --users "$users" >/dev/null
        for clients in 1 8 64; do run "$side $clients-connections" --connections "$clients" >> "$results"; done
        run "$side 8x16-batches" --connections 8 --pipeline 16 --batch 1 >> "$results"
        if [ "${WRITES:-0}" = 1 ]; then
            for clients in 8 64; do
                run "$side $clients-writes" --connections "$clients" --method io.userstore.Store.Execute \
                    --sql "UPDATE kv SET value = 'written' WHERE id = ?" >> "$results"
            done
        fi
        if [ "${DURABLE:-0}" = 1 ]; then
            for clients in 8 64; do
                run "$side $clients-durable" --connections "$clients" --method io.userstore.Store.Execute \
                    --sql "UPDATE kv SET value = 'durable' WHERE id = ?" --durable 1 >> "$results"
            done
        fi
        stop
    done
done
python3 - "$results" <<'EOF'
import sys, collections
rates = collections.defaultdict(list)
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, row, rate, p99, us = line.split()
    rates[(row, side)].append(float(rate))
    cpu[(row, side)].append(float(us))
print("| load | old req/s (runs) | new req/s (runs) | new / old | daemon CPU µs/request, old / new (runs) |")
print("|---|---|---|---|---|")
for row in ["1-connections", "8-connections", "64-connections", "8x16-batches", "8-writes", "64-writes", "8-durable", "64-durable"]:
    old, new = rates[(row, "old")], rates[(row, "new")]
    if not old: continue
    mean = lambda v: sum(v) / len(v)
    spread = lambda v: ', '.join(f'{u:.1f}' for u in v)
    print(f"| {row} | {mean(old):.0f} ({', '.join(f'{v:.0f}' for v in old)}) | {mean(new):.0f} ({', '.join(f'{v:.0f}' for v in new)}) | {mean(new) / mean(old):.2f} "
          f"| {mean(cpu[(row, 'old')]):.1f} / {mean(cpu[(row, 'new')]):.1f} ({spread(cpu[(row, 'old')])} / {spread(cpu[(row, 'new')])}) |")
EOF
