#!/bin/bash
# Makes a CA and one certificate per host for the mutual TLS between daemons (cluster.tls.*,
# docs/cluster.md), with openssl:
#
#   bash scripts/cluster-certs.sh DIR NAME=ADDRESS [NAME=ADDRESS ...]
#   bash scripts/cluster-certs.sh /etc/userstore/cluster host-a=10.0.0.11 host-b=10.0.0.12 host-c=db-c.internal
#
# writes DIR/ca.pem (give it to every host as cluster.tls.ca), DIR/ca.key (keep it off the
# hosts), and DIR/NAME.pem + DIR/NAME.key for each host (its cluster.tls.certificate and
# cluster.tls.key). ADDRESS is what the host's cluster.address names: an IP address or a DNS
# name; the certificate carries it, and a daemon forwarding to the host checks it. An existing
# CA in DIR is reused, so hosts can be added later. P-256 keys, valid for DAYS (default 825).
set -euo pipefail
if (($# < 2)); then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
dir=$1
shift
days=${DAYS:-825}
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" -subj "/CN=userstore cluster CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for pair in "$@"; do
    name=${pair%%=*}
    address=${pair#*=}
    if [[ $address =~ ^[0-9.]+$ || $address == *:* ]]; then san="IP:$address"; else san="DNS:$address"; fi
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/$name.key" \
        -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days "$days" -out "$dir/$name.pem" 2>/dev/null \
        -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$san")
    rm -f "$dir/$name.csr"
    echo "$dir/$name.pem ($san)"
done
chmod 644 "$dir"/*.pem
