#!/usr/bin/env python3
"""The cluster harness (#19, docs/cluster.md): three etcd members and three userstored hosts on
this machine, a workload through all three, faults, and a history checker.

    python3 scripts/cluster-test.py [--users 300] [--seconds 8] [--scenarios kill-owner,...] [--json FILE]

Topology. etcd members on 127.0.0.1 (peer traffic), each also listening for clients on
127.0.0.2-4; host hK is a daemon whose cluster address is 127.0.0.(K+1) and which reaches etcd
at its own address, so that an iptables rule on that address cuts that one host off from etcd
and nothing else. The hosts share nothing but etcd and an S3 bucket: SeaweedFS (`weed server
-s3`, .build/testenv) on 127.0.0.1 is their replica; they forward to one another over mutual TLS
(certificates from scripts/cluster-certs.sh), and hold leases of 3 s.

Workload. Worker threads, each a client of one host (its "local daemon": clients never change
hosts), write to ~300 users: durable INSERTs, plain INSERTs and Opens, recording every call with
its start, end, outcome and, for durable writes, the host and epoch that acknowledged it.
Mid-run, before the fault, a migration is added to every host (SIGHUP reloads it).

Each scenario starts a fresh cluster, rebalances the buckets over the three hosts, runs the
workload, injects its fault, heals it, and checks the history:
  - no acknowledged durable write lost: each is in its user's store at the end;
  - one writer per bucket and epoch: no two hosts acknowledged durable writes for one bucket at
    one epoch, and no acknowledgement names an epoch older than one acknowledged for that bucket
    before it started;
  - schema versions monotonic: no Open saw a lower version than an Open that ended before it;
  - each migration applied once: every store ends at the latest version with exactly one row in
    the harness migration's table (a second application would add a row; it has no IF NOT EXISTS).
It reports per scenario: acknowledged writes, outcomes, recovery (the longest time a user whose
writes were being acknowledged before the fault waited for the next one after it), and the
non-durable writes lost with their window (how long before the fault the oldest lost one was
acknowledged).

Needs the debug build (swift build) and scripts/install-deps.sh (etcd-server, Litestream,
SeaweedFS and boto3 in .build/testenv, iptables). Bounded: every wait has a deadline; every process it starts is killed and every
iptables rule it adds is removed at the end.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMON = os.path.join(ROOT, ".build/debug/userstored")
CTL = os.path.join(ROOT, ".build/debug/userstorectl")
LITESTREAM = os.path.join(ROOT, ".build/testenv/bin/litestream")
WEED = os.path.join(ROOT, ".build/testenv/bin/weed")
TESTENV_PYTHON = os.path.join(ROOT, ".build/testenv/bin/python3")
S3_PROBE = os.path.join(ROOT, "Tests/Helpers/s3-probe.py")
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "cluster-harness", "AWS_SECRET_ACCESS_KEY": "cluster-harness-secret"}
MIGRATIONS = os.path.join(ROOT, "config/migrations")
LEASE = 3
HARNESS_MIGRATION = 900  # added mid-run; its table counts how often it ran on a store
HOSTS = {"h1": "127.0.0.2", "h2": "127.0.0.3", "h3": "127.0.0.4"}


def bucket_of(user):
    return int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big") % 4096


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
        time.sleep(0.1)  # polling processes that give no notice
    raise TimeoutError(what)


class Connection:
    """A varlink connection to a daemon's Unix socket (one call at a time)."""

    def __init__(self, path, timeout):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buffer = b""

    def call(self, method, **parameters):
        self.sock.sendall(json.dumps({"method": method, "parameters": parameters}).encode() + b"\0")
        while b"\0" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)

    def close(self):
        self.sock.close()


class Cluster:
    """3 etcd members and 3 daemons in a temporary directory."""

    def __init__(self, root):
        self.root = root
        self.migrations = os.path.join(root, "migrations")
        shutil.copytree(MIGRATIONS, self.migrations)
        self.s3_ports = free_ports(8)
        self.s3 = None
        self.certs = os.path.join(root, "certs")
        subprocess.run(["bash", os.path.join(ROOT, "scripts/cluster-certs.sh"), self.certs] + [f"{h}={a}" for h, a in HOSTS.items()],
                       check=True, capture_output=True)
        ports = free_ports(7)
        self.client_ports = ports[0:3]
        self.etcd = [{"name": f"e{i}", "port": ports[i], "peer": f"http://127.0.0.1:{ports[3 + i]}", "proc": None} for i in range(3)]
        self.cluster_port = ports[6]
        self.rules = []
        self.hosts = {}
        self.fault_at, self.victim = None, None
        for name, address in HOSTS.items():
            directory = os.path.join(root, name)
            os.makedirs(directory)
            host = {"dir": directory, "address": address, "proc": None, "log": os.path.join(directory, "daemon.log"),
                    "socket": os.path.join(directory, "userstore.sock")}
            self.hosts[name] = host
            with open(os.path.join(directory, "userstored.yaml"), "w") as f:
                f.write(f"""appVersion: "2.0.0"
dataDirectory: {directory}/data
socketPath: {host['socket']}
migrationsDirectory: {self.migrations}
logTarget: stderr
replication:
  replica: "s3://cluster/users?endpoint=http://127.0.0.1:{self.s3_ports[6]}&region=us-east-1&forcePathStyle=true"
  litestream: {LITESTREAM}
cluster:
  host: {name}
  etcd: [{", ".join(f"http://{address}:{m['port']}" for m in self.etcd)}]
  address: {address}:{self.cluster_port}
  leaseSeconds: {LEASE}
  forwardTimeoutMilliseconds: 2000
  tls:
    certificate: {self.certs}/{name}.pem
    key: {self.certs}/{name}.key
    ca: {self.certs}/ca.pem
""")

    # etcd

    def start_etcd(self, i):
        m = self.etcd[i]
        initial = ",".join(f"{x['name']}={x['peer']}" for x in self.etcd)
        listen = ",".join(f"http://{a}:{m['port']}" for a in ["127.0.0.1", *HOSTS.values()])
        state = "existing" if os.path.exists(os.path.join(self.root, m["name"])) else "new"
        m["proc"] = subprocess.Popen(
            ["/usr/bin/etcd", "--name", m["name"], "--data-dir", os.path.join(self.root, m["name"]),
             "--listen-client-urls", listen, "--advertise-client-urls", f"http://127.0.0.1:{m['port']}",
             "--listen-peer-urls", m["peer"], "--initial-advertise-peer-urls", m["peer"],
             "--initial-cluster", initial, "--initial-cluster-state", state, "--initial-cluster-token", self.root,
             "--heartbeat-interval", "100", "--election-timeout", "1000"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.root, m["name"] + ".log"), "ab"))

    def etcd_status(self, i):
        out = subprocess.run(["curl", "-s", "-f", "-m", "1", f"http://127.0.0.1:{self.etcd[i]['port']}/v3/maintenance/status", "-d", "{}"],
                             capture_output=True, text=True).stdout
        try:
            return json.loads(out)
        except ValueError:
            return None

    def etcd_leader(self):
        for i, m in enumerate(self.etcd):
            status = m["proc"] is not None and self.etcd_status(i)
            if status and status.get("leader") == status["header"]["member_id"]:
                return i
        return None

    # daemons

    # the bucket

    def start_s3(self):
        """SeaweedFS on 127.0.0.1 with one access key and the bucket `cluster` (made with boto3)."""
        directory = os.path.join(self.root, "s3")
        os.makedirs(os.path.join(directory, "data"))
        with open(os.path.join(directory, "identities.json"), "w") as f:
            json.dump({"identities": [{"name": "harness", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                                       "credentials": [{"accessKey": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                                        "secretKey": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}]}]}, f)
        p = self.s3_ports
        self.s3 = subprocess.Popen(
            [WEED, "server", f"-dir={directory}/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-master.port={p[0]}", f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}", f"-volume.port.grpc={p[3]}",
             "-filer", f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}",
             "-s3", f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", f"-s3.config={directory}/identities.json",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=64", "-volume.max=0"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(directory, "weed.log"), "ab"))
        endpoint = f"http://127.0.0.1:{p[6]}"
        probe = lambda *args: subprocess.run([TESTENV_PYTHON, S3_PROBE, endpoint, *args], capture_output=True,
                                             env={**os.environ, **S3_CREDENTIALS}).returncode == 0
        wait_for(lambda: probe("ready"), 60, "SeaweedFS answering S3")
        if not (probe("create-bucket", "cluster") and probe("put", "cluster", "warm-up")):
            raise RuntimeError("cannot make the bucket")

    def start_host(self, name):
        host = self.hosts[name]
        if os.path.exists(host["socket"]):
            os.unlink(host["socket"])  # a killed daemon's
        host["proc"] = subprocess.Popen([DAEMON, "--config", os.path.join(host["dir"], "userstored.yaml")],
                                        stdout=subprocess.DEVNULL, stderr=open(host["log"], "ab"),
                                        env={**os.environ, **S3_CREDENTIALS})
        wait_for(lambda: os.path.exists(host["socket"]), 60, f"{name} listening")

    def signal_host(self, name, sig):
        proc = self.hosts[name]["proc"]
        if proc and proc.poll() is None:
            proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)
            self.hosts[name]["proc"] = None

    def start(self):
        self.start_s3()
        for i in range(3):
            self.start_etcd(i)
        wait_for(lambda: self.etcd_leader() is not None, 30, "an etcd leader")
        for name in self.hosts:
            self.start_host(name)
        wait_for(lambda: all(h["live"] for h in self.status("h1").get("hosts", [])) and len(self.status("h1").get("hosts", [])) == 3
                 and self.status("h1").get("unassignedBuckets") == 0, 60, "three hosts and every bucket assigned")
        result = self.ctl("h1", "cluster", "rebalance")
        if result.returncode != 0:
            raise RuntimeError(f"rebalance failed: {result.stderr}")
        self.settle()

    def settle(self, timeout=90):
        """Waits until every live host sees no moves under way and acknowledges."""
        def settled():
            for name, host in self.hosts.items():
                if host["proc"] is None:
                    continue
                status = self.status(name)
                if not status.get("mayAcknowledge") or status.get("movingBuckets") or status.get("requestedMoves") or status.get("unassignedBuckets"):
                    return False
                if any(h["buckets"] for h in status.get("hosts", []) if not h["live"]):
                    return False
            return True
        wait_for(settled, timeout, "the cluster settled")

    def status(self, name):
        result = self.ctl(name, "cluster", "status", "--json")
        try:
            return json.loads(result.stdout)
        except ValueError:
            return {}

    def ctl(self, name, *args):
        return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "USERSTORE_SOCKET": self.hosts[name]["socket"]})

    def add_migration(self):
        with open(os.path.join(self.migrations, f"{HARNESS_MIGRATION:04d}_harness.sql"), "w") as f:
            f.write("-- Up\nCREATE TABLE harness_once (applied_at TEXT NOT NULL);\nINSERT INTO harness_once VALUES (datetime('now'));\n")
        for host in self.hosts.values():
            if host["proc"] is not None:
                host["proc"].send_signal(signal.SIGHUP)

    # faults

    def fault(self, victim):
        """Records the fault's instant (now) and the host it strikes, if one."""
        self.fault_at, self.victim = time.monotonic(), victim

    def cut_from_etcd(self, name):
        ports = ",".join(str(m["port"]) for m in self.etcd)
        rule = ["INPUT", "-d", self.hosts[name]["address"], "-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "DROP"]
        subprocess.run(["iptables", "-I", *rule], check=True)
        self.rules.append(rule)

    def heal_network(self):
        while self.rules:
            subprocess.run(["iptables", "-D", *self.rules.pop()], check=False)

    def close(self):
        self.heal_network()
        for host in self.hosts.values():
            if host["proc"] and host["proc"].poll() is None:
                host["proc"].send_signal(signal.SIGCONT)
                host["proc"].kill()
                host["proc"].wait()
        for m in self.etcd:
            if m["proc"] and m["proc"].poll() is None:
                m["proc"].kill()
                m["proc"].wait()
        if self.s3 and self.s3.poll() is None:
            self.s3.kill()
            self.s3.wait()


class Workload:
    """Worker threads, each a client of one host, writing and opening random users."""

    def __init__(self, cluster, users, workers):
        self.cluster = cluster
        self.users = users
        self.history = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        hosts = list(cluster.hosts)
        self.threads = [threading.Thread(target=self.run, args=(w, hosts[w % len(hosts)]), daemon=True) for w in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)

    def run(self, worker, home):
        rng = random.Random(worker)
        connection = None
        seq = 0
        while not self.stopping.is_set():
            user = rng.choice(self.users)
            seq += 1
            roll = rng.random()
            kind = "durable" if roll < 0.5 else "write" if roll < 0.85 else "open"
            value = f"w{worker}-{seq}"
            entry = {"worker": worker, "home": home, "user": user, "kind": kind, "value": value, "start": time.monotonic()}
            try:
                if connection is None:
                    connection = Connection(self.cluster.hosts[home]["socket"], timeout=30)
                if kind == "open":
                    reply = connection.call("io.userstore.Store.Open", user=user)
                else:
                    reply = connection.call("io.userstore.Store.Execute", user=user, durable=kind == "durable",
                                            sql="INSERT INTO notes (title) VALUES (?)", parameters=[value])
                entry["outcome"], entry["error"] = self.classify(reply)
                parameters = reply.get("parameters", {})
                if entry["error"]:
                    entry["message"] = parameters.get("message") or parameters.get("reason")
                if entry["outcome"] == "ok":
                    entry["host"], entry["epoch"] = parameters.get("host"), parameters.get("epoch")
                    entry["version"] = parameters.get("schemaVersion")
            except (OSError, ConnectionError, ValueError) as error:
                if connection is not None:
                    connection.close()
                connection = None
                entry["outcome"], entry["error"] = "info", type(error).__name__
            entry["end"] = time.monotonic()
            with self.lock:
                self.history.append(entry)
            if entry["outcome"] != "ok":
                time.sleep(0.05)  # back off after a failure, as a client would

    @staticmethod
    def classify(reply):
        """ok | fail (nothing was done) | info (unknown: it may have been applied)."""
        error = reply.get("error")
        if not error:
            return "ok", None
        name = error.rsplit(".", 1)[-1]
        parameters = reply.get("parameters", {})
        if name in ("Retry", "ShuttingDown", "WrongHost"):
            return "fail", name
        if name == "HostUnreachable":
            return ("info" if parameters.get("maybeApplied") else "fail"), name
        if name == "ClusterUnavailable":
            return ("info" if "committed" in parameters.get("message", "") else "fail"), name
        return "info", name  # ReplicationUnavailable (committed here), anything unexpected


def read_store(cluster, user):
    """`user`'s titles and harness-migration rows as the cluster serves them now (any live host)."""
    for attempt in range(100):
        live = [h for h in cluster.hosts.values() if h["proc"] is not None]
        host = live[attempt % len(live)]
        try:
            connection = Connection(host["socket"], timeout=30)
            try:
                titles = connection.call("io.userstore.Store.Query", user=user, sql="SELECT title FROM notes")
                once = connection.call("io.userstore.Store.Query", user=user, sql="SELECT count(*) FROM harness_once")
                version = connection.call("io.userstore.Store.Open", user=user)
            finally:
                connection.close()
        except (OSError, ConnectionError, ValueError):
            time.sleep(0.2)
            continue
        never = once.get("error", "").endswith(".SQLError")  # no harness_once table: the migration never ran
        if any("error" in r for r in (titles, version)) or ("error" in once and not never):
            time.sleep(0.2)  # Retry / ClusterUnavailable: the cluster is still settling
            continue
        return ({row[0] for row in titles["parameters"]["rows"]}, 0 if never else once["parameters"]["rows"][0][0],
                version["parameters"]["schemaVersion"])
    raise RuntimeError(f"cannot read {user}'s store")


def check(cluster, workload, fault_at, victim):
    """Reads the store of every user the workload called (whatever the outcome) as the cluster
    serves it now, then judges the history. A user nobody called has nothing to check, and
    reading it would only create it (on S3, a replica lookup per user)."""
    called = sorted({entry["user"] for entry in workload.history})
    final = {user: read_store(cluster, user) for user in called}
    return judge(workload.history, final, fault_at, victim)


def judge(history, final, fault_at, victim):
    """The checker proper: `history` (the workload's calls) against `final` (user → titles,
    rows of the harness migration's table, schema version). Returns (problems, figures)."""
    problems = []
    history = sorted(history, key=lambda e: e["start"])
    acked = [e for e in history if e["outcome"] == "ok"]
    lost_plain = []
    for user, (titles, once, version) in final.items():
        mine = [e for e in acked if e["user"] == user and e["kind"] != "open"]
        lost = [e for e in mine if e["value"] not in titles]
        durable_lost = [e for e in lost if e["kind"] == "durable"]
        if durable_lost:
            problems.append(f"{user}: {len(durable_lost)} acknowledged durable writes lost, e.g. {durable_lost[0]}")
        lost_plain += [e for e in lost if e["kind"] == "write"]
        if version < HARNESS_MIGRATION or once != 1:
            problems.append(f"{user}: schema version {version}, harness migration applied {once} times (want >= {HARNESS_MIGRATION} and once)")
    # One writer per bucket and epoch; epochs never go back.
    writers = {}
    for e in acked:
        if e["kind"] == "durable":
            if e.get("epoch") is None or e.get("host") is None:
                problems.append(f"durable acknowledgement without host and epoch: {e}")
                continue
            writers.setdefault((bucket_of(e["user"]), e["epoch"]), set()).add(e["host"])
    for (bucket, epoch), hosts in writers.items():
        if len(hosts) > 1:
            problems.append(f"bucket {bucket}, epoch {epoch}: acknowledged by {sorted(hosts)}")
    by_bucket = {}
    for e in acked:
        if e["kind"] == "durable" and e.get("epoch") is not None:
            by_bucket.setdefault(bucket_of(e["user"]), []).append(e)
    for bucket, entries in by_bucket.items():
        newest_ended = (-1, None)  # the highest epoch acknowledged by a call that ended, as calls start
        ends = sorted(entries, key=lambda e: e["end"])
        j = 0
        for e in sorted(entries, key=lambda e: e["start"]):
            while j < len(ends) and ends[j]["end"] < e["start"]:
                if ends[j]["epoch"] > newest_ended[0]:
                    newest_ended = (ends[j]["epoch"], ends[j])
                j += 1
            if e["epoch"] < newest_ended[0]:
                problems.append(f"bucket {bucket}: {e['host']} acknowledged at epoch {e['epoch']} after epoch {newest_ended[0]} was: {e} after {newest_ended[1]}")
                break
    # Schema versions seen by Opens never go back.
    for user in final:
        opens = [e for e in acked if e["user"] == user and e["kind"] == "open"]
        highest = -1
        ends = sorted(opens, key=lambda e: e["end"])
        j = 0
        for e in sorted(opens, key=lambda e: e["start"]):
            while j < len(ends) and ends[j]["end"] < e["start"]:
                highest = max(highest, ends[j]["version"])
                j += 1
            if e["version"] < highest:
                problems.append(f"{user}: an Open saw schema version {e['version']} after one had seen {highest}")
                break
    # Replication came back: some durable write that began after the fault was acknowledged (a
    # run where none was proves nothing about durability after the fault).
    if not any(e["kind"] == "durable" and e["start"] >= fault_at for e in acked):
        problems.append("no durable write that began after the fault was acknowledged")
    # Recovery: from the fault to the end of the last failed call, as the clients of the hosts
    # the fault did not strike see it (a struck host's own clients wait for it to come back):
    # after it, every call of theirs succeeded.
    failed_after = [e for e in history if e["outcome"] != "ok" and e["home"] != victim and e["start"] >= fault_at]
    recovery = max((e["end"] - fault_at for e in failed_after), default=0.0)
    window = max((fault_at - e["end"] for e in lost_plain), default=0.0)

    def percentile(kind, p):
        times = sorted(e["end"] - e["start"] for e in acked if e["kind"] == kind)
        return round(1000 * times[min(len(times) - 1, int(p * len(times)))], 1) if times else None
    last = sorted(failed_after, key=lambda e: e["end"])[-3:]
    return problems, {"last_failures": [f"+{e['end'] - fault_at:.2f}s {e['home']} {e['error']}: {e.get('message')}" for e in last],
                      "acknowledged_durable": sum(e["kind"] == "durable" for e in acked),
                      "acknowledged_plain": sum(e["kind"] == "write" for e in acked), "opens": sum(e["kind"] == "open" for e in acked),
                      "durable_ms_p50": percentile("durable", 0.5), "durable_ms_p99": percentile("durable", 0.99),
                      "plain_ms_p50": percentile("write", 0.5), "failed_after_fault": len(failed_after),
                      "recovery_seconds": round(recovery, 2), "plain_lost": len(lost_plain), "plain_loss_window_seconds": round(window, 2)}


SCENARIOS = {}


def scenario(name):
    def register(function):
        SCENARIOS[name] = function
        return function
    return register


def victim(cluster):
    """The live host owning the most buckets."""
    status = cluster.status("h1")
    return max((h for h in status["hosts"] if h["live"]), key=lambda h: (h["buckets"], h["name"]))["name"]


@scenario("kill-owner")
def kill_owner(cluster, seconds):
    name = victim(cluster)
    cluster.fault(name)
    cluster.signal_host(name, signal.SIGKILL)
    time.sleep(seconds)  # the fault lasts this long
    return lambda: cluster.start_host(name)


@scenario("pause-owner")
def pause_owner(cluster, seconds):
    name = victim(cluster)
    cluster.fault(name)
    cluster.signal_host(name, signal.SIGSTOP)
    time.sleep(max(seconds, 2 * LEASE))  # longer than the lease: its buckets move
    return lambda: cluster.signal_host(name, signal.SIGCONT)


@scenario("kill-etcd-leader")
def kill_etcd_leader(cluster, seconds):
    leader = cluster.etcd_leader()
    cluster.fault(None)
    cluster.etcd[leader]["proc"].kill()
    cluster.etcd[leader]["proc"].wait()
    cluster.etcd[leader]["proc"] = None
    time.sleep(seconds)
    return lambda: cluster.start_etcd(leader)


@scenario("partition-owner")
def partition_owner(cluster, seconds):
    name = victim(cluster)
    cluster.fault(name)
    cluster.cut_from_etcd(name)
    time.sleep(max(seconds, 2 * LEASE))  # longer than the lease: its buckets move
    return cluster.heal_network


@scenario("move")
def move(cluster, seconds):
    status = cluster.status("h1")
    hosts = sorted(h["name"] for h in status["hosts"] if h["live"])
    cluster.fault(None)
    connection = Connection(cluster.hosts["h1"]["socket"], timeout=30)
    for bucket in range(0, 4096, 32):  # 128 buckets, each to another host
        reply = connection.call("io.userstore.Admin.MoveBucket", bucket=bucket, host=hosts[(bucket // 32) % len(hosts)])
        if "error" in reply:
            raise RuntimeError(f"move failed: {reply}")
    connection.close()
    time.sleep(seconds)
    return lambda: None


@scenario("drain")
def drain(cluster, seconds):
    name = victim(cluster)
    cluster.fault(name)
    result = cluster.ctl("h1", "cluster", "drain", name)
    if result.returncode != 0:
        raise RuntimeError(f"drain failed: {result.stderr}")
    time.sleep(seconds)
    return lambda: None


def run(name, users, seconds, workers):
    root = tempfile.mkdtemp(prefix="userstore-cluster-")
    cluster = Cluster(root)
    try:
        cluster.start()
        names = [f"u{i:04d}" for i in range(users)]
        workload = Workload(cluster, names, workers)
        workload.start()
        time.sleep(seconds / 2)  # warm-up: the run's length, not a synchronisation
        cluster.add_migration()
        time.sleep(seconds / 2)
        heal = SCENARIOS[name](cluster, seconds)
        heal()
        healed_at = time.monotonic()
        time.sleep(seconds)  # the workload goes on after the fault is healed
        workload.stop()
        cluster.settle()
        problems, figures = check(cluster, workload, cluster.fault_at, cluster.victim)
        outcomes = {}
        for entry in workload.history:
            key = entry["outcome"] + (f" {entry['error']}" if entry.get("error") else "")
            outcomes[key] = outcomes.get(key, 0) + 1
        return {"scenario": name, "users": users, "fault_seconds": round(healed_at - cluster.fault_at, 2), **figures,
                "outcomes": outcomes, "problems": problems}
    except Exception as error:  # the harness itself failed: report it as this scenario's problem
        logs = {n: open(h["log"], errors="replace").read()[-3000:] for n, h in cluster.hosts.items() if os.path.exists(h["log"])}
        return {"scenario": name, "users": users, "problems": [f"harness: {error!r}"], "logs": logs}
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def self_test():
    """The checker must catch what it claims to: fabricated histories, each with one violation
    (and one without), judged without a cluster."""
    def call(user, kind, start, end, value="", host=None, epoch=None, version=None, home="h1"):
        return {"user": user, "kind": kind, "start": start, "end": end, "value": value, "outcome": "ok",
                "host": host, "epoch": epoch, "version": version, "home": home}
    u = "u0001"
    good = [call(u, "durable", 0, 1, "a", "h1", 10), call(u, "durable", 2, 3, "b", "h2", 20), call(u, "open", 4, 5, version=HARNESS_MIGRATION)]
    final = {u: ({"a", "b"}, 1, HARNESS_MIGRATION)}
    cases = {
        "clean": (good, final, 0),
        "lost durable write": (good, {u: ({"a"}, 1, HARNESS_MIGRATION)}, 1),
        "two hosts, one epoch": (good + [call(u, "durable", 6, 7, "c", "h3", 20)], {u: ({"a", "b", "c"}, 1, HARNESS_MIGRATION)}, 1),
        "epoch went back": (good + [call(u, "durable", 6, 7, "c", "h1", 10)], {u: ({"a", "b", "c"}, 1, HARNESS_MIGRATION)}, 1),
        "version went back": (good + [call(u, "open", 6, 7, version=HARNESS_MIGRATION - 1)], final, 1),
        "migration applied twice": (good, {u: ({"a", "b"}, 2, HARNESS_MIGRATION)}, 1),
        "concurrent calls may disagree": (good + [call(u, "durable", 2.5, 2.9, "c", "h1", 10)], {u: ({"a", "b", "c"}, 1, HARNESS_MIGRATION)}, 0),
        "nothing durable after the fault": (good, final, 1, 2.5),
    }
    failed = False
    for name, (history, state, expected, *fault) in cases.items():
        problems, _ = judge(history, state, fault[0] if fault else 1.5, None)
        ok = len(problems) == expected
        failed |= not ok
        if not ok:
            print(f"self-test {name}: FAILED, expected {expected} problems, got {problems}")
    return not failed


def serve():
    """Three hosts to try by hand: started, rebalanced, then left running until Ctrl-C."""
    root = tempfile.mkdtemp(prefix="userstore-cluster-")
    cluster = Cluster(root)
    try:
        cluster.start()
        print(f"three hosts up (data, logs and certificates under {root}); their sockets:")
        for name, host in cluster.hosts.items():
            print(f"  {name} ({host['address']}:{cluster.cluster_port}): {host['socket']}")
        print(f"try: USERSTORE_SOCKET={cluster.hosts['h1']['socket']} {CTL} cluster status")
        print("Ctrl-C stops them all", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up as Ctrl-C does
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=8, help="workload time before, during and after each fault")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--self-test", action="store_true", help="only check that the checker catches fabricated violations")
    parser.add_argument("--serve", action="store_true", help="start the three hosts, print their sockets and wait for Ctrl-C (no workload)")
    args = parser.parse_args()
    if args.serve:
        return serve()
    if not self_test():
        sys.exit("the history checker missed a fabricated violation")
    print("history checker self-test: every fabricated violation caught", flush=True)
    if args.self_test:
        return
    if os.geteuid() != 0 and "partition-owner" in args.scenarios:
        sys.exit("partition-owner needs root (iptables)")
    results = []
    for name in args.scenarios.split(","):
        result = run(name, args.users, args.seconds, args.workers)
        results.append(result)
        verdict = "OK" if not result["problems"] else "FAILED: " + "; ".join(result["problems"][:5])
        figures = {k: v for k, v in result.items() if k not in ("scenario", "problems", "logs")}
        print(f"{name}: {json.dumps(figures)} {verdict}", flush=True)
        if result.get("logs"):
            for host, log in result["logs"].items():
                print(f"--- {host}'s last lines\n{log}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    sys.exit(1 if any(r["problems"] for r in results) else 0)


if __name__ == "__main__":
    main()
