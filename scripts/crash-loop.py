#!/usr/bin/env python3
"""Crash loop: SIGKILL userstored at random moments while 8 clients write to 8 users and new
migrations arrive, restart it each time, then check every store.

Proves: no acknowledged write is lost, every file passes PRAGMA integrity_check, no store is left
between versions (user_version = app_version.schema_version = the newest applied migration, and
every migration up to it applied exactly once).

With --replica URL (file:///… or s3://…; the daemon's own log, replication.engine: log) every
write is durable, and after the last kill the disk is lost too: a new daemon on an empty data
directory restores every store from the replica, and every durably acknowledged write must be
there (make crash-s3: 1,000 kills on SeaweedFS).

    python3 scripts/crash-loop.py --daemon .build/release/userstored [--kills 100] [--replica URL] [--json]

Prints a summary (and with --json one JSON object) and exits 1 if anything is wrong. Run by the
test suite with --kills 10; the full run's figures are in docs/reliability.md.
"""
import argparse, json, os, random, shutil, signal, sqlite3, subprocess, sys, tempfile, threading, time

from varlink_client import call, connect

USERS = [f"crash{n}" for n in range(8)]


class Daemon:
    def __init__(self, binary, directory, replica=None):
        self.binary, self.directory, self.replica = binary, directory, replica
        self.config = os.path.join(directory, "userstored.yaml")
        self.socket = os.path.join(directory, "userstore.sock")
        self.migrations = os.path.join(directory, "migrations")
        os.makedirs(self.migrations)
        with open(os.path.join(self.migrations, "0001_log.sql"), "w") as f:
            f.write("CREATE TABLE log (v INTEGER NOT NULL);\nCREATE INDEX log_v ON log (v);\n")
        self.write_config(directory + "/data")
        self.process = None
        self.log = open(os.path.join(directory, "daemon.log"), "ab")

    def write_config(self, data):
        with open(self.config, "w") as f:
            f.write(f'appVersion: "1.0.0"\ndataDirectory: {data}\nsocketPath: {self.socket}\n'
                    f"migrationsDirectory: {self.migrations}\nlogTarget: stderr\n")
            if self.replica:
                f.write(f'replication:\n  replica: "{self.replica}"\n  engine: log\n  durableTimeoutMilliseconds: 5000\n')

    def start(self):
        self.process = subprocess.Popen([self.binary, "--config", self.config], stdout=subprocess.DEVNULL, stderr=self.log)
        connect(self.socket).close()  # serving

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait()

    def add_migration(self, version):
        # Each new migration touches every row: a kill may land in the middle of it.
        with open(os.path.join(self.migrations, f"{version:04d}_step.sql"), "w") as f:
            f.write(f"ALTER TABLE log ADD COLUMN c{version} INTEGER NOT NULL DEFAULT {version};\n"
                    f"UPDATE log SET c{version} = v + {version};\n")


def writer(daemon, user, acked, stop):
    """Inserts 0, 1, 2, ... for `user` (durably with a replica); records the values the daemon
    acknowledged."""
    value, sock = 0, None
    durable = {"durable": True} if daemon.replica else {}
    while not stop.is_set():
        try:
            if sock is None:
                sock = connect(daemon.socket)
            reply = call(sock, "io.userstore.Store.Execute", user=user, sql="INSERT INTO log (v) VALUES (?)", parameters=[value], **durable)
            if "error" not in reply:
                acked.append(value)
            value += 1
        except (OSError, ConnectionError, ValueError):
            if sock:
                sock.close()
            sock = None
            value += 1  # unknown outcome: never counted as acknowledged
            time.sleep(0.005)
    if sock:
        sock.close()


def check_store(path, acked):
    problems = []
    db = sqlite3.connect(path)
    try:
        if db.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
            problems.append("integrity_check failed")
        user_version = db.execute("PRAGMA user_version").fetchone()[0]
        schema_version = db.execute("SELECT schema_version FROM app_version").fetchone()[0]
        applied = [row[0] for row in db.execute("SELECT version FROM schema_migrations ORDER BY version")]
        if not (user_version == schema_version == (applied[-1] if applied else 0)):
            problems.append(f"between versions: user_version {user_version}, app_version {schema_version}, applied {applied}")
        if applied != list(range(1, len(applied) + 1)):
            problems.append(f"migrations applied {applied}")
        present = {row[0] for row in db.execute("SELECT v FROM log")}
        lost = [v for v in acked if v not in present]
        if lost:
            problems.append(f"{len(lost)} acknowledged writes lost (first {lost[:5]})")
        return problems, len(lost)
    finally:
        db.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--max-delay", type=float, default=0.4, help="longest run between kills, seconds")
    parser.add_argument("--replica", help="replicate to this URL with the daemon's own log, durable writes, and lose the disk at the end")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="userstore-crash-")
    daemon = Daemon(os.path.abspath(args.daemon), directory, args.replica)
    started = time.monotonic()
    acked = {user: [] for user in USERS}
    stop = threading.Event()
    daemon.start()
    threads = [threading.Thread(target=writer, args=(daemon, user, acked[user], stop)) for user in USERS]
    for thread in threads:
        thread.start()
    version = 1
    for kill in range(args.kills):
        time.sleep(random.uniform(0.0, args.max_delay))
        daemon.kill()
        if kill % 10 == 9:
            version += 1
            daemon.add_migration(version)
        daemon.start()
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    # Every store brought to the last version once more, then checked offline.
    sock = connect(daemon.socket)
    for user in USERS:
        call(sock, "io.userstore.Store.Open", user=user)
    sock.close()
    exit_status = daemon.stop()
    data = os.path.join(directory, "data")
    if args.replica:
        # The disk lost: a new data directory on the same replica restores every store.
        data = os.path.join(directory, "data-restored")
        daemon.write_config(data)
        daemon.start()
        sock = connect(daemon.socket)
        for user in USERS:
            reply = call(sock, "io.userstore.Store.Open", user=user)
            if "error" in reply or reply.get("parameters", {}).get("created"):
                print(f"{user}: not restored: {reply}", file=sys.stderr)
        sock.close()
        exit_status = daemon.stop() or exit_status
    problems, lost, checked = {}, 0, 0
    layout = os.path.join(data, "stores")
    for root, _, files in os.walk(layout):
        for name in files:
            if name.endswith(".sqlite"):
                user = name[: -len(".sqlite")]
                found, missing = check_store(os.path.join(root, name), acked.get(user, []))
                checked += 1
                lost += missing
                if found:
                    problems[user] = found
    summary = {
        "kills": args.kills, "seconds": round(time.monotonic() - started, 1), "acknowledgedWrites": sum(len(v) for v in acked.values()),
        "lostWrites": lost, "storesChecked": checked, "migrationsAdded": version - 1, "problems": problems, "cleanStopStatus": exit_status,
        "replica": args.replica, "restoredFromReplica": bool(args.replica),
    }
    ok = not problems and checked == len(USERS) and exit_status == 0
    if args.json:
        print(json.dumps(summary))
    else:
        what = "durably acknowledged writes, the disk then lost and every store restored from the replica" if args.replica else "acknowledged writes"
        print(f"crash loop: {args.kills} SIGKILLs in {summary['seconds']} s, {summary['acknowledgedWrites']} {what}, "
              f"{lost} lost, {checked} stores checked, {version - 1} migrations added under fire, problems: {problems or 'none'}")
    if ok:
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"kept {directory} for inspection", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
