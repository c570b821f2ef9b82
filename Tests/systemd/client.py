#!/usr/bin/env python3
"""A minimal varlink call for the in-container checks: client.py SOCKET METHOD [JSON_PARAMETERS]
Prints the reply (or the error) as one line of JSON; exit 0 for a reply, 1 for an error,
2 when the connection fails."""
import json, socket, sys

try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
except OSError as error:
    print(json.dumps({"connectError": str(error)}))
    sys.exit(2)
parameters = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
s.sendall(json.dumps({"method": sys.argv[2], "parameters": parameters}).encode() + b"\0")
reply = b""
while not reply.endswith(b"\0"):
    chunk = s.recv(65536)
    if not chunk:
        print(json.dumps({"connectError": "closed"}))
        sys.exit(2)
    reply += chunk
message = json.loads(reply[:-1])
print(json.dumps(message))
sys.exit(1 if "error" in message else 0)
