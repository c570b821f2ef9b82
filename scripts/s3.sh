#!/bin/bash
# A local S3 API for trying replication by hand and for scripts: SeaweedFS (`weed server -s3`,
# installed into .build/testenv by scripts/install-deps.sh) on 127.0.0.1, data in .run/s3-<port>, one
# access key, a bucket named userstore. Usage:
#   bash scripts/s3.sh start   # starts it (if not running) and prints the variables to export
#   bash scripts/s3.sh stop
#   bash scripts/s3.sh env     # the variables: S3 endpoint, credentials, replica URL
# Port: $USERSTORE_S3_PORT (default 8333); SeaweedFS's own Prometheus metrics (S3 requests,
# bytes received per bucket) on that port + 8. The tests start their own on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
weed="$root/.build/testenv/bin/weed"
python="$root/.build/testenv/bin/python3"
port=${USERSTORE_S3_PORT:-8333}
dir="$root/.run/s3-$port" # one per port: a bench and a churn run may each have their own
access=userstore-dev
secret=userstore-dev-secret

print_env() {
    echo "export AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret"
    echo "export USERSTORED_REPLICATION_REPLICA='s3://userstore/dev?endpoint=http://127.0.0.1:$port&region=us-east-1&forcePathStyle=true'"
}

case "${1:-}" in
start)
    [ -x "$weed" ] || bash scripts/install-deps.sh >/dev/null
    mkdir -p "$dir/data"
    if [ -f "$dir/weed.pid" ] && kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null; then
        print_env
        exit 0
    fi
    printf '{"identities":[{"name":"userstore","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
        "$access" "$secret" > "$dir/identities.json"
    # Every port fixed from $port, so that a second run finds the same server.
    setsid "$weed" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port=$((port + 1)) -master.port.grpc=$((port + 2)) -volume.port=$((port + 3)) -volume.port.grpc=$((port + 4)) \
        -filer -filer.port=$((port + 5)) -filer.port.grpc=$((port + 6)) \
        -s3 -s3.port="$port" -s3.port.grpc=$((port + 7)) -s3.config="$dir/identities.json" -s3.port.iceberg=0 -s3.port.lance=0 \
        -master.volumeSizeLimitMB=64 -volume.max=0 -metricsPort=$((port + 8)) >"$dir/weed.log" 2>&1 &
    echo $! > "$dir/weed.pid"
    for _ in $(seq 1 300); do
        if AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret "$python" Tests/Helpers/s3-probe.py "http://127.0.0.1:$port" ready 2>/dev/null; then
            AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret "$python" Tests/Helpers/s3-probe.py "http://127.0.0.1:$port" create-bucket userstore 2>/dev/null || true
            print_env
            exit 0
        fi
        sleep 0.2
    done
    echo "SeaweedFS did not answer on 127.0.0.1:$port (see $dir/weed.log)" >&2
    exit 1
    ;;
stop)
    if [ -f "$dir/weed.pid" ]; then kill "$(cat "$dir/weed.pid")" 2>/dev/null || true; rm -f "$dir/weed.pid"; fi
    ;;
env)
    print_env
    ;;
*)
    echo "usage: bash scripts/s3.sh start|stop|env" >&2
    exit 2
    ;;
esac
