#!/bin/bash
# Runs inside the nspawn container, under PID 1 systemd, as the unit userstore-test.service.
# Every check prints "ok: ..." or "FAIL: ..."; the container exits with the number of failures.
export PATH=/usr/local/bin:/usr/bin:/usr/sbin
SOCK=/run/userstore/userstore.sock
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=$((fail + 1)); fi; }
# Waits for a condition (at most 30 s); never a blind sleep.
wait_for() { for _ in $(seq 1 600); do eval "$1" && return 0; sleep 0.05; done; return 1; }
call() { python3 /results/client.py "$SOCK" "$@"; }
show() { systemctl show -p "$1" --value userstored.service; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

echo "== static checks on the installed units"
verify=$(cd / && systemd-analyze verify --man=no /usr/local/lib/systemd/system/userstored.service /usr/local/lib/systemd/system/userstored.socket 2>&1)
check "systemd-analyze verify prints nothing" '[ -z "$verify" ]'
[ -n "$verify" ] && echo "$verify"
exposure=$(systemd-analyze security --no-pager userstored.service | tail -1 | grep -o 'level for userstored.service: [0-9.]*' | grep -o '[0-9.]*$')
echo "exposure: $exposure"
check "systemd-analyze security exposure <= 2.0" "python3 -c 'import sys; sys.exit(0 if float(\"$exposure\") <= 2.0 else 1)'"
check "journald's rate limit is raised for fleet runs (LogRateLimitBurst=150000 per 30 s)" '[ "$(systemctl show -p LogRateLimitBurst --value userstored.service)" = 150000 ] && [ "$(systemctl show -p LogRateLimitIntervalUSec --value userstored.service)" = 30s ]'
check "the userstore user and groups exist (sysusers.d)" 'getent passwd userstore >/dev/null && getent group userstore-clients >/dev/null'

echo "== socket activation"
systemctl start userstored.socket
check "the socket belongs to userstore-clients, mode 0660" '[ "$(stat -c "%G %a" $SOCK)" = "userstore-clients 660" ]'
check "the socket unit listens" '[ "$(systemctl show -p ActiveState --value userstored.socket)" = active ] && [ -S $SOCK ]'
check "the service is not running before the first request" '[ "$(show ActiveState)" = inactive ]'
reply=$(call io.userstore.Store.Open '{"user":"alice"}')
check "Open of a new user migrates it through the socket-activated service" '[ "$(echo "$reply" | field "[\"parameters\"][\"schemaVersion\"]")" = 6 ]'
# systemd moves the unit to active when it has processed READY=1, which can come just after the
# daemon answered its first request on the socket it was passed: wait for it, on a loaded machine.
check "ActiveState=active" 'wait_for "[ \"\$(show ActiveState)\" = active ]"'
check "the socket keeps its group once the service runs (no recursive chown)" '[ "$(stat -c "%G" $SOCK)" = userstore-clients ]'
check "StatusText is set" 'wait_for "[ -n \"\$(show StatusText)\" ]"'
echo "StatusText: $(show StatusText)"

echo "== metrics on a Unix socket, inside the hardened unit"
check "GET /metrics answers on /run/userstore/metrics.sock" \
  'python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(\"/run/userstore/metrics.sock\"); s.sendall(b\"GET /metrics HTTP/1.0\\r\\n\\r\\n\"); data=b\"\"
while True:
    chunk=s.recv(65536)
    if not chunk: break
    data+=chunk
sys.exit(0 if b\"userstore_requests_total\" in data and data.startswith(b\"HTTP/1.0 200\") else 1)"'

echo "== journal"
journalctl --sync
steps=$(journalctl -u userstored.service -o json MESSAGE_ID=f5758f67da3c4e729b85971efc913007 USERSTORE_USER=alice | python3 -c '
import json, sys
entries = [json.loads(line) for line in sys.stdin]
print(sum(1 for e in entries if e.get("_SYSTEMD_UNIT") == "userstored.service"))')
check "journalctl -u userstored.service holds 6 migration steps of alice with _SYSTEMD_UNIT" '[ "$steps" = 6 ]'
check "the catalog is installed and explains entries (journalctl -x)" 'journalctl --update-catalog && journalctl -u userstored.service -x MESSAGE_ID=180220a202c744eaa0f767646a141c18 --no-pager | grep -q "pending migrations committed"'

echo "== userstorectl"
for user in bob carol dave; do call io.userstore.Store.Open "{\"user\":\"$user\"}" >/dev/null; done
check "userstorectl status works" 'userstorectl status | grep -q "4 known"'
printf -- '-- Up\nCREATE TABLE extra (x);\n-- Down\nDROP TABLE extra;\n' > /etc/userstore/migrations/0007_extra.sql
systemctl reload userstored
check "systemctl reload: RELOADING then READY again" 'wait_for "journalctl -u userstored.service --no-pager | grep -q \"reloaded: 7 migrations\""'
check "userstorectl migrate --all picks up the new migration" 'userstorectl migrate --all | grep -q "4 migrated"'
check "Open after the reload reports version 7" '[ "$(call io.userstore.Store.Open "{\"user\":\"eve\"}" | field "[\"parameters\"][\"schemaVersion\"]")" = 7 ]'

echo "== stop, data kept"
call io.userstore.Store.Execute '{"user":"alice","sql":"INSERT INTO notes (title) VALUES (?)","parameters":["survives restarts"]}' >/dev/null
systemctl stop userstored.service
check "systemctl stop exits cleanly" '[ "$(show Result)" = success ] && [ "$(show ExecMainStatus)" = 0 ]'
check "data written before the stop is there after the next activation" \
  'call io.userstore.Store.Query "{\"user\":\"alice\",\"sql\":\"SELECT title FROM notes\"}" | grep -q "survives restarts"'

echo "== a fleet run over stores nobody has open: shared syncfs under the unit's system-call filter"
printf -- '-- Up\nCREATE TABLE extra2 (x);\n-- Down\nDROP TABLE extra2;\n' > /etc/userstore/migrations/0008_extra2.sql
systemctl restart userstored.service
check "userstorectl migrate --all migrates the 5 stores, none of them open (group commit: syncfs)" 'userstorectl migrate --all | grep -q "5 migrated"'
check "... and they serve version 8" '[ "$(call io.userstore.Store.Open "{\"user\":\"bob\"}" | field "[\"parameters\"][\"schemaVersion\"]")" = 8 ]'

echo "== access"
useradd --system --no-create-home --groups userstore-clients app
clients=$(getent group userstore-clients | cut -d: -f3)
check "a member of userstore-clients may use io.userstore.Store" \
  'setpriv --reuid=app --regid=$(id -g app) --init-groups python3 /results/client.py $SOCK io.userstore.Store.Open "{\"user\":\"app1\"}" >/dev/null'
check "... but not io.userstore.Admin" \
  'setpriv --reuid=app --regid=$(id -g app) --init-groups python3 /results/client.py $SOCK io.userstore.Admin.Status | grep -q PermissionDenied'
check "a user outside the groups cannot even connect (socket mode 0660)" \
  '[ "$(setpriv --reuid=nobody --regid=nogroup --clear-groups python3 /results/client.py $SOCK io.userstore.Store.Open "{\"user\":\"x\"}" >/dev/null; echo $?)" = 2 ]'
check "a user who has the socket's group but is not an allowed client is refused" \
  "setpriv --reuid=nobody --regid=nogroup --groups=$clients python3 /results/client.py $SOCK io.userstore.Store.Open '{\"user\":\"x\"}' | grep -q PermissionDenied"

echo "== a stop that waits for the replica longer than TimeoutStopSec= is given the time (EXTEND_TIMEOUT_USEC)"
replica=/var/lib/userstore-replica
cp /etc/userstore/userstored.yaml /results/userstored.yaml.plain
printf 'replication:\n  replica: "file://%s"\n  durableTimeoutMilliseconds: 8000\n' "$replica" >> /etc/userstore/userstored.yaml
mkdir -p "$replica" /run/systemd/system/userstored.service.d
chown userstore:userstore "$replica"
printf '[Service]\nTimeoutStopSec=3s\nReadWritePaths=%s\n' "$replica" > /run/systemd/system/userstored.service.d/stop.conf
systemctl daemon-reload
systemctl restart userstored.service
# Replication new to a data directory that holds stores: said so, not guessed.
check "userstorectl replication init binds the data directory to the new replica" 'userstorectl replication init >/dev/null'
check "a durable write is acknowledged by the replicated daemon" \
  'call io.userstore.Store.Execute "{\"user\":\"alice\",\"sql\":\"INSERT INTO notes (title) VALUES (?)\",\"parameters\":[\"replicated\"],\"durable\":true}" >/dev/null'
# The log's folder made unwritable (a file in its way): the write below stays unstored.
mv "$replica/log" "$replica/log.aside" && echo "in the way" > "$replica/log"
call io.userstore.Store.Execute '{"user":"alice","sql":"INSERT INTO notes (title) VALUES (?)","parameters":["while the log is away"]}' >/dev/null
check "replication reports degraded" \
  'wait_for "call io.userstore.Admin.Replication | grep -q \"\\\"state\\\": \\\"degraded\\\"\""'
began=$(date +%s)
systemctl stop userstored.service
took=$(( $(date +%s) - began ))
echo "the stop took ${took} s (TimeoutStopSec=3s, durable time-out 8 s)"
check "the stop outlasted TimeoutStopSec=3s and ended cleanly, not killed (Result=success, status 0)" \
  '[ "$took" -ge 4 ] && [ "$(show Result)" = success ] && [ "$(show ExecMainStatus)" = 0 ]'
check "... after waiting for the log (stopping with records the log did not store)" \
  'journalctl -u userstored.service --no-pager | grep -q "stopping with records the log did not store"'
rm "$replica/log" && mv "$replica/log.aside" "$replica/log"
cp /results/userstored.yaml.plain /etc/userstore/userstored.yaml
rm -r /run/systemd/system/userstored.service.d
systemctl daemon-reload
check "the write the log did not store is served after the restart" \
  'call io.userstore.Store.Query "{\"user\":\"alice\",\"sql\":\"SELECT title FROM notes\"}" | grep -q "while the log is away"'

echo "== watchdog"
mkdir -p /run/systemd/system/userstored.service.d
printf '[Service]\nWatchdogSec=2s\nEnvironment=USERSTORED_TEST_FAULT=stop-watchdog\n' > /run/systemd/system/userstored.service.d/fault.conf
systemctl daemon-reload
systemctl restart userstored.service
check "a daemon that stops feeding the watchdog is killed with Result=watchdog" \
  'wait_for "journalctl -u userstored.service --no-pager | grep -q \"Failed with result .watchdog.\""'
check "... and restarted by systemd" 'wait_for "[ \$(show NRestarts) -ge 1 ]"'
journalctl -u userstored.service --no-pager | grep -i -E "watchdog|restart|fault" | tail -8
rm -r /run/systemd/system/userstored.service.d
systemctl daemon-reload
systemctl restart userstored.service
check "healthy again after the fault is removed" 'wait_for "[ \"\$(show ActiveState)\" = active ]" && call io.userstore.Store.Open "{\"user\":\"alice\"}" >/dev/null'

echo "== $fail failure(s)"
systemctl exit "$fail" --no-block
