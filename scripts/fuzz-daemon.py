#!/usr/bin/env python3
"""Live fuzz of a running userstored: hostile bytes on many connections for a bounded time.

Mutated valid calls (bit flips, truncation, splices), random bytes, deep nesting, huge strings,
invalid UTF-8, lone surrogates, wrong types, unknown methods, NULs in odd places — from
--connections connections at once — while a well-behaved client keeps querying. Then checks:
the daemon is alive (never crashed), its RSS stayed bounded, and a well-formed call afterwards
answers within 100 ms.

    python3 scripts/fuzz-daemon.py --daemon .build/release/userstored [--seconds 60] [--connections 32] [--json]
"""
import argparse, json, multiprocessing, os, random, shutil, signal, socket, subprocess, sys, tempfile, threading, time

from varlink_client import receive

VALID = [
    {"method": "io.userstore.Store.Open", "parameters": {"user": "fuzz"}},
    {"method": "io.userstore.Store.Query", "parameters": {"user": "fuzz", "sql": "SELECT ?, ?", "parameters": [1, "x"]}},
    {"method": "io.userstore.Store.Execute", "parameters": {"user": "fuzz", "sql": "INSERT INTO notes (title) VALUES (:t)", "parameters": {"t": "hi"}}},
    {"method": "io.userstore.Store.Batch", "parameters": {"user": "fuzz", "statements": [{"sql": "SELECT 1"}, {"sql": "SELECT ?", "parameters": [{"blob": "AAE="}]}]}},
    {"method": "io.userstore.Store.Begin", "parameters": {"user": "fuzz"}},
    {"method": "io.userstore.Admin.Status", "parameters": {}},
    {"method": "io.userstore.Admin.Plan", "parameters": {"user": "fuzz"}},
    {"method": "org.varlink.service.GetInfo"},
    {"method": "io.userstore.Store.Query", "parameters": {"user": "fuzz", "sql": "SELECT ?", "parameters": [{"integer": "9223372036854775807"}]}, "more": True},
]


def hostile(rng):
    kind = rng.randrange(12)
    call = rng.choice(VALID)
    if call["method"].endswith(".Begin"):
        # A transaction holds its store until its connection closes: on a store of its own, so
        # that the other fuzzers do not spend their time waiting for it.
        call = {"method": call["method"], "parameters": {"user": f"fuzztx{rng.randrange(1000)}"}}
    base = json.dumps(call).encode()
    if kind == 0:  # bit flips
        data = bytearray(base)
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data).replace(b"\0", b"") + b"\0"
    if kind == 1:  # truncated
        return base[: rng.randrange(1, len(base))] + b"\0"
    if kind == 2:  # random bytes
        return bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 4096))) + b"\0"
    if kind == 3:  # deep nesting
        depth = rng.choice([65, 1000, 100000])
        return b'{"method":"io.userstore.Store.Query","parameters":' + b"[" * depth + b"]" * depth + b"}\0"
    if kind == 4:  # huge string
        return b'{"method":"io.userstore.Store.Query","parameters":{"user":"fuzz","sql":"' + b"A" * rng.choice([10**5, 10**6, 4 * 10**6]) + b'"}}\0'
    if kind == 5:  # invalid UTF-8
        return b'{"method":"io.userstore.Store.Open","parameters":{"user":"\xc3\x28\xed\xa0\x80\xf4\x90\x80\x80"}}\0'
    if kind == 6:  # lone surrogates
        return b'{"method":"io.userstore.Store.Query","parameters":{"user":"fuzz","sql":"SELECT \'\\ud800\'"}}\0'
    if kind == 7:  # wrong types everywhere
        call = rng.choice(VALID)
        params = {key: rng.choice([None, 0, -1, 1.5, True, [], {}, "x" * 300]) for key in (call.get("parameters") or {"user": 1})}
        return json.dumps({"method": call["method"], "parameters": params, "more": rng.choice([True, 1, None])}).encode() + b"\0"
    if kind == 8:  # unknown methods and interfaces
        return json.dumps({"method": rng.choice(["io.userstore.Store.Nope", "x", "", ".", "a.b.c.d", "io.userstore.Admin."])}).encode() + b"\0"
    if kind == 9:  # NULs in odd places (several frames)
        cut = rng.randrange(1, len(base))
        return base[:cut] + b"\0" + base[cut:] + b"\0"
    if kind == 10:  # many calls at once (pipelined)
        return b"".join(json.dumps(rng.choice(VALID)).encode() + b"\0" for _ in range(rng.randrange(2, 64)))
    return b'{"method":"io.userstore.Store.Query","parameters":{"user":"fuzz","sql":"SELECT 1","parameters":[1e999999, -0.0, 123456789012345678901234567890]}}\0'


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--migrations", default=os.path.join(os.path.dirname(__file__), "..", "config", "migrations"))
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="userstore-fuzz-")
    sock_path = os.path.join(directory, "userstore.sock")
    config = os.path.join(directory, "userstored.yaml")
    with open(config, "w") as f:
        f.write(f'appVersion: "2.0.0"\ndataDirectory: {directory}/data\nsocketPath: {sock_path}\n'
                f"migrationsDirectory: {os.path.abspath(args.migrations)}\nlogTarget: stderr\nlimits:\n  maxRequestBytes: 1048576\n")
    # The daemon's stderr is kept (a crash's backtrace lands there) and shown if it died.
    daemon_log = open(os.path.join(directory, "daemon.log"), "wb")
    daemon = subprocess.Popen([os.path.abspath(args.daemon), "--config", config], stdout=subprocess.DEVNULL, stderr=daemon_log,
                              env=dict(os.environ, SWIFT_BACKTRACE="enable=yes,interactive=no"))
    for _ in range(3000):
        if os.path.exists(sock_path):
            break
        time.sleep(0.01)
    time.sleep(0.1)
    baseline = rss_kib(daemon.pid)
    peak = baseline
    deadline = time.monotonic() + args.seconds
    sent = multiprocessing.Value("q", 0)

    def fuzzer(seed):
        # A process each (not a thread): generating hostile bytes is CPU work for Python.
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(2)
                s.connect(sock_path)
                for _ in range(rng.randrange(1, 20)):
                    s.sendall(hostile(rng))
                    with sent.get_lock():
                        sent.value += 1
                    if rng.random() < 0.5:
                        try:
                            s.recv(65536)
                        except OSError:
                            break
                s.close()
            except OSError:
                time.sleep(0.01)

    bystander_failures = [0]
    bystander_calls = [0]

    def bystander():
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock_path)
        while time.monotonic() < deadline:
            try:
                s.sendall(b'{"method":"io.userstore.Store.Query","parameters":{"user":"bystander","sql":"SELECT 1"}}\0')
                data = receive(s)
            except OSError:
                bystander_failures[0] += 1  # the daemon hung up on a well-behaved client (or died)
                return
            bystander_calls[0] += 1
            if not data.startswith(b'{"parameters"'):
                bystander_failures[0] += 1
            time.sleep(0.002)  # pacing: ~400 calls/s leaves the interpreter to the fuzzers

    threads = [multiprocessing.Process(target=fuzzer, args=(args.seed + n,)) for n in range(args.connections)] + [threading.Thread(target=bystander)]
    for thread in threads:
        thread.start()
    while time.monotonic() < deadline and daemon.poll() is None:
        peak = max(peak, rss_kib(daemon.pid))
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    alive = daemon.poll() is None
    answer_ms = None
    if alive:
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock_path)
        started = time.monotonic()
        s.sendall(b'{"method":"io.userstore.Store.Query","parameters":{"user":"after","sql":"SELECT 42"}}\0')
        data = receive(s)
        answer_ms = (time.monotonic() - started) * 1000
        ok_after = b"[[42]]" in data
        s.close()
        daemon.send_signal(signal.SIGTERM)
        exit_status = daemon.wait(timeout=30)
    else:
        ok_after, exit_status = False, daemon.returncode
    summary = {"seconds": args.seconds, "connections": args.connections, "seed": args.seed, "hostileMessages": sent.value,
               "alive": alive, "rssBaselineKiB": baseline, "rssPeakKiB": peak, "bystanderCalls": bystander_calls[0],
               "bystanderFailures": bystander_failures[0], "wellFormedCallMilliseconds": answer_ms, "exitStatus": exit_status}
    ok = alive and ok_after and answer_ms is not None and answer_ms < 100 and bystander_failures[0] == 0 and exit_status == 0 and peak < baseline + 256 * 1024
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"live fuzz: {sent.value} hostile messages on {args.connections} connections for {args.seconds} s (seed {args.seed}); "
              f"alive: {alive}; RSS {baseline} -> peak {peak} KiB; bystander {bystander_calls[0]} calls, {bystander_failures[0]} failed; "
              f"a well-formed call then answered in {answer_ms and round(answer_ms, 1)} ms; clean stop: {exit_status == 0}")
    if ok:
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"kept {directory}; the daemon's stderr ends:", file=sys.stderr)
        with open(os.path.join(directory, "daemon.log"), "rb") as f:
            sys.stderr.write(f.read()[-6000:].decode(errors="replace"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
