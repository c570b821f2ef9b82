#!/usr/bin/env python3
"""Replication at scale (issue #38): one userstored replicating to S3 (SeaweedFS on loopback,
scripts/s3.sh) while 100,000 users are touched through maxOpenStores 1,024, then the host's disk
lost and a sample of users brought back from the bucket.

    python3 scripts/churn.py --daemon .build/release/userstored [--users 100000] [--revisits 0.1]
        [--workers 16] [--sample 1000] [--json FILE] [--no-replication]

What runs:
  touch    every user once, in order, by `workers` connections: a durable INSERT (the store is
           created, migrated, its base shipped to the daemon's log, written, and the write
           confirmed in the bucket); then `revisits` x users more touches of users already written (a reopen:
           the LRU closed them long ago), each a durable INSERT too. Every user's last durable
           value is remembered.
  sample   every 10 s: the daemon's RSS and open descriptors (/proc), open stores, and
           SeaweedFS's own counters of S3 requests and bytes received (its Prometheus endpoint:
           the S3 side, not the daemon's account of it).
  restore  the daemon stopped, its data directory deleted, a new daemon on the same bucket; for
           `sample` users picked at random, a Query of their last value: each must come back
           from the bucket with its last durable write.
With --no-replication the same touches are plain INSERTs with replication off (the baseline the
daemon's figures are read against), and the sample is read back after a restart on the same disk.
Prints a table per minute and a summary; exits 1 when a sampled user did not come back whole.
Not part of make test (make churn).
"""
import argparse, json, os, random, re, shutil, signal, subprocess, sys, tempfile, threading, time, urllib.request

from varlink_client import call, connect, call_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = int(os.environ.get("USERSTORE_S3_PORT", "8533"))
REPLICATING = "--no-replication" not in sys.argv


def s3(command):
    """scripts/s3.sh on this run's port (SeaweedFS with its metrics endpoint on PORT + 8)."""
    env = dict(os.environ, USERSTORE_S3_PORT=str(PORT))
    return subprocess.run(["bash", os.path.join(ROOT, "scripts/s3.sh"), command], env=env, check=True,
                          capture_output=True, text=True).stdout


def seaweed_counters():
    """(S3 requests, S3 PUT requests, bytes received) to the bucket, from SeaweedFS's own metrics."""
    if not REPLICATING:
        return 0.0, 0.0, 0.0
    text = urllib.request.urlopen(f"http://127.0.0.1:{PORT + 8}/metrics", timeout=10).read().decode()
    requests = puts = received = 0.0
    for line in text.splitlines():
        if 'bucket="userstore"' not in line:
            continue
        if line.startswith("SeaweedFS_s3_request_total{"):
            value = float(line.rsplit(" ", 1)[1])
            requests += value
            if 'type="PUT"' in line:
                puts += value
        elif line.startswith("SeaweedFS_s3_bucket_traffic_received_bytes_total"):
            received += float(line.rsplit(" ", 1)[1])
    return requests, puts, received


def process_usage(pid):
    """(RSS in MiB, open descriptors) of `pid`, or (0, 0) when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            rss = int(re.search(r"VmRSS:\s+(\d+)", status.read()).group(1)) / 1024
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, AttributeError):
        return 0, 0


class Daemon:
    def __init__(self, binary, root, replica):
        self.binary, self.root = binary, root
        self.data, self.socket = os.path.join(root, "data"), os.path.join(root, "userstore.sock")
        self.config = os.path.join(root, "userstored.yaml")
        with open(self.config, "w") as config:
            config.write(f"""appVersion: "1.0.0"
dataDirectory: {self.data}
socketPath: {self.socket}
migrationsDirectory: {os.path.join(ROOT, "config/migrations")}
maxOpenStores: 1024
logTarget: stderr
""")
            if replica:
                config.write(f"""replication:
  replica: "{replica}"
""")
        self.process = None

    def start(self):
        env = dict(os.environ, AWS_ACCESS_KEY_ID="userstore-dev", AWS_SECRET_ACCESS_KEY="userstore-dev-secret")
        self.log = open(os.path.join(self.root, "daemon.log"), "a")
        self.process = subprocess.Popen([self.binary, "--config", self.config], stdout=self.log, stderr=self.log, env=env)
        connect(self.socket, timeout=60).close()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=300)
        self.log.close()

    def open_stores(self):
        return call_once(self.socket, "io.userstore.Admin.Status")["parameters"].get("openStores", 0)


def inspect(pid):
    """Prints where `pid`'s resident memory is: by kind of mapping (smaps), malloc's own account
    (malloc_info, through gdb), and the RSS once malloc has returned its free pages (malloc_trim)."""
    kinds = {}
    name = ""
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                name = fields[5] if len(fields) > 5 else "[anon]"
            elif fields[0] == "Rss:":
                kinds[name] = kinds.get(name, 0) + int(fields[1])
    threads = len(os.listdir(f"/proc/{pid}/task"))
    print(f"threads {threads}; resident KiB by mapping:", flush=True)
    for name, kib in sorted(kinds.items(), key=lambda item: -item[1])[:8]:
        print(f"  {kib:9d} {name}", flush=True)
    if not shutil.which("gdb"):
        print("malloc's account and malloc_trim need gdb (apt-get install -y gdb)", flush=True)
        return
    account = os.path.join(tempfile.gettempdir(), f"malloc-info-{pid}.xml")
    subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", f'set $f = (void*)fopen("{account}", "w")',
                    "-ex", "call (int)malloc_info(0, $f)", "-ex", "call (int)fclose($f)"], capture_output=True)
    with open(account) as xml:
        text = xml.read().rsplit("</heap>", 1)[-1]  # the totals over every arena, after the last one
    os.remove(account)
    free = sum(int(size) for size in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"', text))
    system = re.search(r'<system type="current" size="(\d+)"', text)
    print(f"malloc: {int(system.group(1)) / 2**20 if system else 0:.1f} MiB from the system, {free / 2**20:.1f} MiB of it free", flush=True)
    print(f"RSS before malloc_trim: {process_usage(pid)[0]:.1f} MiB", flush=True)
    subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "call (int)malloc_trim(0)"], capture_output=True)
    print(f"RSS after malloc_trim: {process_usage(pid)[0]:.1f} MiB", flush=True)


def touch(daemon, users, revisits, workers, last, failures):
    """Durable INSERTs: every user once, then `revisits` users already written, by `workers`."""
    order = list(users) + [random.choice(users) for _ in range(revisits)]
    position = [0]
    lock = threading.Lock()

    def worker():
        sock = connect(daemon.socket, call_timeout=120)
        while True:
            with lock:
                if position[0] >= len(order):
                    break
                index = position[0]
                position[0] += 1
            user = order[index]
            value = f"{user}-{index}"
            reply = call(sock, "io.userstore.Store.Execute", user=user, durable=REPLICATING,
                         sql="INSERT INTO notes (title) VALUES (?)", parameters=[value])
            with lock:
                if "error" in reply:
                    failures.append((user, reply["error"]))
                elif index >= last.get(user, (-1, ""))[0]:
                    last[user] = (index, value)
        sock.close()

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    return threads, position


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--users", type=int, default=100000)
    parser.add_argument("--revisits", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=16)  # the 16 concurrent clients of issue #52's target
    parser.add_argument("--sample", type=int, default=1000)
    parser.add_argument("--json")
    parser.add_argument("--no-replication", action="store_true", help="plain INSERTs with replication off: the baseline")
    parser.add_argument("--inspect", action="store_true",
                        help="before stopping the daemon, print where its memory is (/proc smaps, malloc's own account) and its RSS after malloc_trim (gdb)")
    arguments = parser.parse_args()

    if REPLICATING:
        s3("start")
    root = tempfile.mkdtemp(prefix="userstore-churn-")
    prefix = f"churn-{os.getpid()}"
    replica = f"s3://userstore/{prefix}?endpoint=http://127.0.0.1:{PORT}&region=us-east-1&forcePathStyle=true" if REPLICATING else None
    daemon = Daemon(arguments.daemon, root, replica)
    daemon.start()
    users = [f"c{index:06d}" for index in range(arguments.users)]
    last, failures, samples = {}, [], []
    started = time.monotonic()
    threads, position = touch(daemon, users, int(arguments.users * arguments.revisits), arguments.workers, last, failures)
    base = seaweed_counters()
    print(f"{'min':>5} {'touched':>8} {'touch/s':>8} {'open':>5} {'daemon MiB':>10} {'fds':>5} "
          f"{'S3 req/s':>8} {'PUT/s':>6} {'MB in/min':>9}", flush=True)
    previous = (started, 0, base)
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(timeout=10)
            break
        now = time.monotonic()
        if now - previous[0] < 10 and any(thread.is_alive() for thread in threads):
            continue
        open_stores = daemon.open_stores()
        counters = seaweed_counters()
        elapsed = now - previous[0]
        sample = {
            "seconds": round(now - started, 1), "touched": position[0], "open_stores": open_stores,
            "daemon_rss_mib": round(process_usage(daemon.process.pid)[0], 1), "daemon_fds": process_usage(daemon.process.pid)[1],
            "touches_per_second": round((position[0] - previous[1]) / elapsed, 1),
            "s3_requests_per_second": round((counters[0] - previous[2][0]) / elapsed, 1),
            "s3_puts_per_second": round((counters[1] - previous[2][1]) / elapsed, 1),
            "s3_mb_received_per_minute": round((counters[2] - previous[2][2]) / elapsed * 60 / 1e6, 2),
        }
        samples.append(sample)
        print(f"{sample['seconds'] / 60:5.1f} {sample['touched']:8d} {sample['touches_per_second']:8.1f} {open_stores:5d} "
              f"{sample['daemon_rss_mib']:10.1f} {sample['daemon_fds']:5d} "
              f"{sample['s3_requests_per_second']:8.1f} {sample['s3_puts_per_second']:6.1f} {sample['s3_mb_received_per_minute']:9.2f}", flush=True)
        previous = (now, position[0], counters)
    touch_seconds = time.monotonic() - started
    totals = [after - before for after, before in zip(seaweed_counters(), base)]
    if arguments.inspect:
        inspect(daemon.process.pid)
    daemon.stop()

    # The host's disk is lost: a new daemon on the same bucket brings sampled users back
    # (without replication: the same disk, read back after a restart).
    if REPLICATING:
        shutil.rmtree(daemon.data)
    daemon.start()
    picked = random.sample(sorted(last), min(arguments.sample, len(last)))
    back, wrong = 0, []
    restore_started = time.monotonic()
    sock = connect(daemon.socket, call_timeout=120)
    for user in picked:
        reply = call(sock, "io.userstore.Store.Query", user=user, sql="SELECT title FROM notes ORDER BY id DESC LIMIT 1")
        rows = reply.get("parameters", {}).get("rows", [])
        if rows and rows[0][0] == last[user][1]:
            back += 1
        else:
            wrong.append((user, reply.get("error") or rows))
    sock.close()
    restore_seconds = time.monotonic() - restore_started
    daemon.stop()
    shutil.rmtree(root, ignore_errors=True)

    summary = {
        "replication": REPLICATING, "users": arguments.users, "touches": position[0], "failed_touches": len(failures), "touch_seconds": round(touch_seconds, 1),
        "s3_requests": int(totals[0]), "s3_puts": int(totals[1]), "s3_bytes_received": int(totals[2]),
        "max_daemon_rss_mib": max((s["daemon_rss_mib"] for s in samples), default=0),
        "max_daemon_fds": max((s["daemon_fds"] for s in samples), default=0),
        "sampled": len(picked), "came_back": back, "restore_seconds": round(restore_seconds, 1),
        "first_failures": failures[:5], "wrong": wrong[:5],
    }
    print(json.dumps(summary, indent=2))
    if arguments.json:
        with open(arguments.json, "w") as output:
            json.dump({"summary": summary, "samples": samples}, output, indent=2)
    sys.exit(0 if back == len(picked) and not failures else 1)


if __name__ == "__main__":
    main()
