#!/usr/bin/env python3
"""Connects to a daemon's cluster port (cluster.listen) the way another daemon does — TCP and
TLS, with or without a client certificate — sends one varlink call and prints what happened, as
one JSON line: {"outcome": "reply", "reply": {...}} or {"outcome": "refused", "error": "..."}.
Python's ssl module: an implementation of the handshake independent of the daemon's.

    peer-probe.py HOST PORT CA [CERT KEY] [--method M] [--parameters JSON]
"""
import argparse
import json
import socket
import ssl

parser = argparse.ArgumentParser()
parser.add_argument("host")
parser.add_argument("port", type=int)
parser.add_argument("ca")
parser.add_argument("cert", nargs="?")
parser.add_argument("key", nargs="?")
parser.add_argument("--method", default="io.userstore.Store.Open")
parser.add_argument("--parameters", default='{"user": "probe"}')
args = parser.parse_args()

context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.load_verify_locations(args.ca)
context.check_hostname = False
if args.cert:
    context.load_cert_chain(args.cert, args.key)
try:
    with socket.create_connection((args.host, args.port), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            tls.sendall(json.dumps({"method": args.method, "parameters": json.loads(args.parameters)}).encode() + b"\0")
            data = b""
            while not data.endswith(b"\0"):
                chunk = tls.recv(65536)
                if not chunk:
                    raise ConnectionError("closed without a reply")
                data += chunk
    print(json.dumps({"outcome": "reply", "reply": json.loads(data[:-1])}))
except (ssl.SSLError, ConnectionError, OSError) as error:
    print(json.dumps({"outcome": "refused", "error": str(error)}))
