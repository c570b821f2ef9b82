#!/bin/bash
# Boots a real systemd (PID 1) in systemd-nspawn on the host's own /usr, with userstore
# installed by `make install` into a staging folder, and runs Tests/systemd/inside.sh there.
# Exit code: the number of failed checks (0: all passed). Output: every check.
# Usage: bash Tests/systemd/nspawn-test.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${1:-$(mktemp -d)}"
stage="$work/stage"
results="$work/results"
rm -rf "$stage" "$results"
mkdir -p "$results"
# The debug build is installed (a release build takes minutes); it needs /opt/swift, bound below.
# BIN_DIR (set by the Swift test) names binaries already built.
BUILD_CONFIGURATION=debug BIN_DIR="${BIN_DIR:-}" PREFIX=/usr/local DESTDIR="$stage" bash scripts/install.sh install >/dev/null
cp Tests/systemd/inside.sh Tests/systemd/client.py "$results/"
cat > "$results/userstore-test.service" <<'UNIT'
[Unit]
Description=userstore checks under PID 1 systemd
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/bin/bash /results/inside.sh
StandardOutput=file:/results/inside.log
StandardError=file:/results/inside.log
UNIT
rm -rf /run/systemd/nspawn* 2>/dev/null || true
status=0
systemd-nspawn -q -D / --volatile=yes --register=no --keep-unit --console=pipe \
    --bind-ro="$stage/usr/local:/usr/local" \
    --bind="$stage/etc/userstore:/etc/userstore" \
    --bind-ro=/opt/swift \
    --bind="$results:/results" \
    --bind-ro="$results/userstore-test.service:/etc/systemd/system/userstore-test.service" \
    -b systemd.wants=userstore-test.service systemd.mask=systemd-firstboot.service </dev/null >"$work/console.log" 2>&1 || status=$?
cat "$results/inside.log" 2>/dev/null || { echo "no results; console:"; tail -50 "$work/console.log"; }
rm -rf /run/systemd/nspawn* 2>/dev/null || true
exit "$status"
