#!/usr/bin/env python3
"""The cluster harness (#19, docs/cluster.md): 3 etcd members and 3 userstored hosts on this
machine, sharing a file:// replica, a workload of durable writes through all three, faults, and
a history checker.

    python3 scripts/cluster-test.py [--users 300] [--scenarios kill-owner,pause-owner,...] [--json FILE]

Each scenario starts a fresh cluster, runs the workload, injects its fault, heals it, and then
checks the history:
  - no lost acknowledged write: every durable INSERT that was acknowledged is in the user's
    store as its owner serves it at the end (read after every host is back);
  - migrations once: across the three daemons' logs, each (user, migration version) was applied
    at most once (migration-step events), and every store ends at the latest version;
It reports, per scenario, the recovery time: the longest time any user went without an
acknowledged write after the fault.

Clients do not forward (cluster.forward is false): the workload follows WrongHost to the host it
names, as a client library would. Needs the debug build (swift build) and
scripts/install-deps.sh (etcd-server, Litestream). Bounded: every wait has a deadline; every
process it starts is killed at the end.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import varlink_client  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMON = os.path.join(ROOT, ".build/debug/userstored")
CTL = os.path.join(ROOT, ".build/debug/userstorectl")
LITESTREAM = os.path.join(ROOT, ".build/testenv/bin/litestream")
MIGRATIONS = os.path.join(ROOT, "config/migrations")
LATEST = max(int(name[:4]) for name in os.listdir(MIGRATIONS) if name[:4].isdigit())
LEASE = 3


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)  # polling external processes that give no notice
    raise TimeoutError(what)


class Cluster:
    """3 etcd members and 3 daemons in a temporary directory."""

    def __init__(self, root):
        self.root = root
        self.replica = os.path.join(root, "replica")
        os.makedirs(self.replica)
        ports = free_ports(6)
        self.etcd = [{"name": f"e{i}", "client": f"http://127.0.0.1:{ports[2 * i]}", "peer": f"http://127.0.0.1:{ports[2 * i + 1]}", "proc": None}
                     for i in range(3)]
        self.hosts = {f"h{i}": {"dir": os.path.join(root, f"h{i}"), "proc": None, "log": os.path.join(root, f"h{i}.log")} for i in range(1, 4)}
        for name, host in self.hosts.items():
            os.makedirs(host["dir"])
            host["socket"] = os.path.join(host["dir"], "userstore.sock")
            with open(os.path.join(host["dir"], "userstored.yaml"), "w") as f:
                f.write(f"""appVersion: "2.0.0"
dataDirectory: {host['dir']}/data
socketPath: {host['socket']}
migrationsDirectory: {MIGRATIONS}
logTarget: stderr
replication:
  replica: file://{self.replica}
  litestream: {LITESTREAM}
cluster:
  host: {name}
  etcd: [{", ".join(m["client"] for m in self.etcd)}]
  address: 127.0.0.{int(name[1:]) + 1}:7001
  leaseSeconds: {LEASE}
  forward: false
""")

    def start_etcd(self, i):
        m = self.etcd[i]
        initial = ",".join(f"{x['name']}={x['peer']}" for x in self.etcd)
        m["proc"] = subprocess.Popen(
            ["/usr/bin/etcd", "--name", m["name"], "--data-dir", os.path.join(self.root, m["name"]),
             "--listen-client-urls", m["client"], "--advertise-client-urls", m["client"],
             "--listen-peer-urls", m["peer"], "--initial-advertise-peer-urls", m["peer"],
             "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", self.root,
             "--heartbeat-interval", "100", "--election-timeout", "1000"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.root, m["name"] + ".log"), "ab"))

    def etcd_leader(self):
        for i, m in enumerate(self.etcd):
            if m["proc"] is None:
                continue
            try:
                out = subprocess.run(["curl", "-s", "-f", "-m", "1", m["client"] + "/v3/maintenance/status", "-d", "{}"],
                                     capture_output=True, text=True).stdout
                status = json.loads(out)
                if status.get("leader") == status["header"]["member_id"]:
                    return i
            except (ValueError, KeyError):
                continue
        return None

    def start_host(self, name):
        host = self.hosts[name]
        host["proc"] = subprocess.Popen([DAEMON, "--config", os.path.join(host["dir"], "userstored.yaml")],
                                        stdout=subprocess.DEVNULL, stderr=open(host["log"], "ab"))
        wait_for(lambda: os.path.exists(host["socket"]), 30, f"{name} listening")

    def stop_host(self, name, sig=signal.SIGTERM):
        proc = self.hosts[name]["proc"]
        if proc and proc.poll() is None:
            proc.send_signal(sig)
            if sig in (signal.SIGTERM, signal.SIGKILL):
                proc.wait(timeout=60)
        if sig in (signal.SIGTERM, signal.SIGKILL):
            self.hosts[name]["proc"] = None

    def start(self):
        for i in range(3):
            self.start_etcd(i)
        wait_for(lambda: self.etcd_leader() is not None, 30, "an etcd leader")
        for name in self.hosts:
            self.start_host(name)

    def ctl(self, name, *args):
        return subprocess.run([CTL, *args], capture_output=True, text=True, env={**os.environ, "USERSTORE_SOCKET": self.hosts[name]["socket"]})

    def close(self):
        for host in self.hosts.values():
            if host["proc"] and host["proc"].poll() is None:
                host["proc"].send_signal(signal.SIGCONT)
                host["proc"].kill()
                host["proc"].wait()
        for m in self.etcd:
            if m["proc"] and m["proc"].poll() is None:
                m["proc"].send_signal(signal.SIGCONT)
                m["proc"].kill()
                m["proc"].wait()
        # Litestream children of killed daemons.
        subprocess.run(["pkill", "-KILL", "-f", f"litestream replicate -config {self.root}"], check=False)


class Workload:
    """Worker threads writing durably to random users, following WrongHost; a history of every call."""

    def __init__(self, cluster, users, workers=6):
        self.cluster = cluster
        self.users = users
        self.owner = {}  # the host a user was last served by or named by WrongHost
        self.history = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(w,), daemon=True) for w in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)

    def run(self, worker):
        seq = 0
        rng = random.Random(worker)
        connections = {}
        while not self.stopping.is_set():
            user = rng.choice(self.users)
            seq += 1
            value = f"w{worker}-{seq}"
            host = self.owner.get(user) or rng.choice(list(self.cluster.hosts))
            for _ in range(4):  # follow WrongHost a few times
                started = time.monotonic()
                outcome, named = self.write(connections, host, user, value)
                with self.lock:
                    self.history.append({"user": user, "value": value, "host": host, "outcome": outcome, "start": started, "end": time.monotonic()})
                if outcome == "wrong-host" and named:
                    host = named
                    continue
                if outcome == "ok":
                    self.owner[user] = host
                break
            if outcome not in ("ok",):
                time.sleep(0.05)  # back off before the next write after a failure

    def write(self, connections, host, user, value):
        """One durable INSERT; returns (ok | wrong-host | fail | info, named host)."""
        path = self.cluster.hosts[host]["socket"]
        try:
            sock = connections.get(host) or varlink_client.connect(path, timeout=0, call_timeout=15)
            connections[host] = sock
            reply = varlink_client.call(sock, "io.userstore.Store.Execute", user=user, durable=True,
                                        sql="INSERT INTO notes (title) VALUES (?)", parameters=[value])
        except (OSError, ConnectionError, ValueError):
            connections.pop(host, None)
            return "info", None  # unknown: it may have been applied
        error = reply.get("error")
        if not error:
            return "ok", None
        if error.endswith(".WrongHost"):
            return "wrong-host", reply.get("parameters", {}).get("host")
        if error.endswith((".Retry", ".InvalidUser", ".ShuttingDown")) or (error.endswith(".ClusterUnavailable") and "committed" not in json.dumps(reply)):
            return "fail", None  # nothing was done
        return "info", None  # committed here perhaps (ReplicationUnavailable, ClusterUnavailable after commit)


def read_back(cluster, user):
    """Every title in `user`'s store as its owner serves it now (following WrongHost)."""
    host = next(iter(cluster.hosts))
    for _ in range(20):
        try:
            reply = varlink_client.call_once(cluster.hosts[host]["socket"], "io.userstore.Store.Query", call_timeout=30, user=user, sql="SELECT title FROM notes")
        except OSError:
            host = random.choice(list(cluster.hosts))
            continue
        error = reply.get("error")
        if not error:
            return {row[0] for row in reply["parameters"]["rows"]}, host
        if error.endswith(".WrongHost"):
            host = reply["parameters"]["host"]
            continue
        time.sleep(0.2)  # Retry / ClusterUnavailable: the cluster is settling
    raise RuntimeError(f"cannot read {user}'s store")


def check(cluster, workload, fault_at):
    problems = []
    acked = {}
    for entry in workload.history:
        if entry["outcome"] == "ok":
            acked.setdefault(entry["user"], set()).add(entry["value"])
    for user in workload.users:
        titles, _ = read_back(cluster, user)
        lost = acked.get(user, set()) - titles
        if lost:
            problems.append(f"{user}: {len(lost)} acknowledged writes lost, e.g. {sorted(lost)[:3]}")
    applied = {}
    for host in cluster.hosts.values():
        with open(host["log"], errors="replace") as f:
            for line in f:
                if "event=migration-step" in line:
                    user = re.search(r"user=(\S+)", line)
                    version = re.search(r"version=(\d+)", line)
                    if user and version:
                        key = (user.group(1).rstrip("]"), int(version.group(1)))
                        applied[key] = applied.get(key, 0) + 1
    twice = [key for key, count in applied.items() if count > 1]
    if twice:
        problems.append(f"migrations applied more than once: {twice[:5]}")
    # Recovery: per user, the longest gap between acknowledged writes that spans the fault.
    recovery = 0.0
    by_user = {}
    for entry in sorted(workload.history, key=lambda e: e["end"]):
        if entry["outcome"] == "ok":
            by_user.setdefault(entry["user"], []).append(entry["end"])
    for times in by_user.values():
        before = [t for t in times if t <= fault_at]
        after = [t for t in times if t > fault_at]
        if before and after:
            recovery = max(recovery, after[0] - fault_at)
    return problems, recovery, sum(len(v) for v in acked.values())


SCENARIOS = {}


def scenario(name):
    def register(function):
        SCENARIOS[name] = function
        return function
    return register


def busiest_host(cluster):
    status = json.loads(cluster.ctl("h1", "cluster", "status", "--json").stdout)
    return max((h for h in status["hosts"] if h["live"]), key=lambda h: h["buckets"])["name"]


@scenario("kill-owner")
def kill_owner(cluster):
    victim = busiest_host(cluster)
    cluster.stop_host(victim, signal.SIGKILL)
    return lambda: cluster.start_host(victim)


@scenario("pause-owner")
def pause_owner(cluster):
    victim = busiest_host(cluster)
    cluster.stop_host(victim, signal.SIGSTOP)
    time.sleep(2 * LEASE)  # the fault's duration: longer than the lease
    return lambda: cluster.stop_host(victim, signal.SIGCONT)


@scenario("kill-etcd-leader")
def kill_etcd_leader(cluster):
    leader = cluster.etcd_leader()
    cluster.etcd[leader]["proc"].kill()
    cluster.etcd[leader]["proc"].wait()
    cluster.etcd[leader]["proc"] = None
    return lambda: cluster.start_etcd(leader)


@scenario("drain")
def drain(cluster):
    victim = busiest_host(cluster)
    result = cluster.ctl("h1", "cluster", "drain", victim)
    if result.returncode != 0:
        raise RuntimeError(f"drain failed: {result.stderr}")
    return lambda: None


@scenario("move")
def move(cluster):
    status = json.loads(cluster.ctl("h1", "cluster", "status", "--json").stdout)
    hosts = [h["name"] for h in status["hosts"] if h["live"]]
    for bucket in range(0, 4096, 64):  # 64 buckets moved to the next host
        result = cluster.ctl("h1", "cluster", "move", str(bucket), hosts[bucket % len(hosts)])
        if result.returncode != 0:
            raise RuntimeError(f"move failed: {result.stderr}")
    return lambda: None


def run(name, users, seconds):
    root = tempfile.mkdtemp(prefix="userstore-cluster-")
    cluster = Cluster(root)
    try:
        cluster.start()
        names = [f"u{i:04d}" for i in range(users)]
        wait_for(lambda: cluster.ctl("h1", "cluster", "status").returncode == 0, 30, "every bucket assigned")
        workload = Workload(cluster, names)
        workload.start()
        time.sleep(seconds)  # the workload's warm-up: the length of the run, not a synchronisation
        fault_at = time.monotonic()
        heal = SCENARIOS[name](cluster)
        time.sleep(seconds)  # the workload runs on through the fault
        heal()
        time.sleep(seconds)  # and after it is healed
        workload.stop()
        wait_for(lambda: all(cluster.ctl(h, "cluster", "status").returncode == 0 for h in cluster.hosts
                             if cluster.hosts[h]["proc"] is not None), 60, "the cluster settled")
        problems, recovery, acked = check(cluster, workload, fault_at)
        outcomes = {}
        for entry in workload.history:
            outcomes[entry["outcome"]] = outcomes.get(entry["outcome"], 0) + 1
        return {"scenario": name, "users": users, "acknowledged": acked, "outcomes": outcomes,
                "recovery_seconds": round(recovery, 2), "problems": problems}
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=8, help="workload time before, during and after each fault")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = []
    failed = False
    for name in args.scenarios.split(","):
        result = run(name, args.users, args.seconds)
        results.append(result)
        failed |= bool(result["problems"])
        print(f"{name}: {result['acknowledged']} acknowledged durable writes, outcomes {result['outcomes']}, "
              f"recovery {result['recovery_seconds']} s, {'OK' if not result['problems'] else 'FAILED: ' + '; '.join(result['problems'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
