"""The varlink calls scripts/crash-loop.py, soak.py and fuzz-daemon.py make: JSON messages
ending in a NUL byte over the daemon's Unix socket (docs/ and the .varlink files describe them)."""
import json
import socket
import time


def receive(sock):
    """The next reply's bytes, up to (not including) its NUL; ConnectionError if the peer hangs up."""
    data = b""
    while not data.endswith(b"\0"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data[:-1]


def call(sock, method, **parameters):
    """Sends one call on `sock` and returns its reply as a dict."""
    sock.sendall(json.dumps({"method": method, "parameters": parameters}).encode() + b"\0")
    return json.loads(receive(sock))


def connect(path, timeout=30.0, call_timeout=10):
    """A connection to the socket at `path`, retrying until the daemon listens (up to `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(call_timeout)
            sock.connect(path)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def call_once(path, method, call_timeout=600, **parameters):
    """One call on a connection of its own."""
    sock = connect(path, timeout=0, call_timeout=call_timeout)
    try:
        return call(sock, method, **parameters)
    finally:
        sock.close()
