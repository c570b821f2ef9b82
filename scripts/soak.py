#!/usr/bin/env python3
"""Soak: userstored under a steady mix of reads, writes, first opens of new users and fleet
migrations at about half of its measured capacity for a long time (10 minutes by default),
sampling its memory and descriptors; proves they stay flat and latency steady.

    python3 scripts/soak.py --daemon .build/release/userstored --load .build/release/userstore-load \
        [--minutes 10] [--fraction 0.5] [--json FILE]

What runs (each minute, three paced C load generators side by side, a fresh set of connections):
  reads      Query `SELECT value FROM kv WHERE id = ?` on 1,000 users, at fraction x 0.7 of the
             read capacity measured first;
  writes     Execute `INSERT INTO log (v) VALUES (?)` on the same users, at fraction x 0.25 of the
             measured write capacity;
  new users  Query on users never seen before (a new name space each minute), 25 per second:
             each call creates a store and migrates it; with maxOpenStores 1024 the LRU closes
             stores all the time;
  migrations every 3 minutes a new migration file, Admin.Reload, and Admin.Migrate(all) of the
             whole fleet (thousands of stores) while the load goes on.
The daemon's RSS and open descriptors are read from /proc every 5 seconds. Growth is the least
squares slope over the minutes after the first (which fills caches and the LRU). Prints a table
per minute and a summary; exits 1 on a failed call, a daemon that died or did not stop cleanly,
or a store failing integrity_check. Not part of make test (make soak).
"""
import argparse, json, os, shutil, signal, sqlite3, subprocess, sys, tempfile, threading, time

from varlink_client import call_once

USERS = 1000
ROWS = 1000


def slope(points):
    """Least squares slope of (x, y) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


class Soak:
    def __init__(self, args):
        self.args = args
        self.directory = tempfile.mkdtemp(prefix="userstore-soak-")
        self.socket = os.path.join(self.directory, "userstore.sock")
        self.migrations = os.path.join(self.directory, "migrations")
        os.makedirs(self.migrations)
        self.write_migration(1, "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL);\n"
                                f"INSERT INTO kv (id, value) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS})\n"
                                "    SELECT i, 'value ' || i FROM n;\n"
                                "CREATE TABLE log (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);\n")
        self.config = os.path.join(self.directory, "userstored.yaml")
        with open(self.config, "w") as f:
            f.write(f'appVersion: "1.0.0"\ndataDirectory: {self.directory}/data\nsocketPath: {self.socket}\n'
                    f"migrationsDirectory: {self.migrations}\nlogTarget: stderr\n")
        self.log = open(os.path.join(self.directory, "daemon.log"), "ab")
        self.samples = []  # (seconds since start, rss MiB, fds)
        self.failures = []
        self.migrations_run = []

    def write_migration(self, version, sql):
        with open(os.path.join(self.migrations, f"{version:04d}_soak{version}.sql"), "w") as f:
            f.write(sql)

    def start(self):
        self.process = subprocess.Popen([self.args.daemon, "--config", self.config], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                call_once(self.socket, "io.userstore.Admin.Status")
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("soak: the daemon did not start (see daemon.log)")

    def load(self, seconds, connections, rate=0, method="io.userstore.Store.Query",
             sql="SELECT value FROM kv WHERE id = ?", user_format="soak%04d", users=USERS, rows=ROWS, threads=1):
        command = [self.args.load, "--socket", self.socket, "--seconds", str(seconds), "--connections", str(connections),
                   "--threads", str(threads), "--users", str(users), "--user-format", user_format, "--method", method,
                   "--sql", sql, "--rows", str(rows), "--rate", str(rate)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    @staticmethod
    def result(process, what):
        output, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"soak: the {what} load generator failed ({process.returncode})")
        return json.loads(output)

    def sample(self):
        pid = self.process.pid
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        self.samples.append((time.monotonic() - self.began, rss, fds))

    def sampler(self, stop):
        while not stop.wait(5):
            if self.process.poll() is not None:
                self.failures.append(f"the daemon exited ({self.process.returncode})")
                return
            self.sample()

    def migrate_fleet(self, version):
        """A new migration for every store, then the whole fleet forced to it."""
        self.write_migration(version, f"ALTER TABLE kv ADD COLUMN c{version} INTEGER NOT NULL DEFAULT {version};\n")
        began = time.monotonic()
        call_once(self.socket, "io.userstore.Admin.Reload")
        reply = call_once(self.socket, "io.userstore.Admin.Migrate", all=True, parallel=2)
        if "error" in reply:
            self.failures.append(f"Migrate to {version}: {reply}")
            return
        p = reply.get("parameters", {})
        self.migrations_run.append({"version": version, "seconds": round(time.monotonic() - began, 1),
                                    "migrated": p.get("migrated"), "failures": p.get("failures"), "total": p.get("total")})
        if p.get("failures"):
            self.failures.append(f"Migrate to {version}: {p.get('failed')}")

    def run(self):
        a = self.args
        self.start()
        # Every soak user opened (created and migrated) once, then capacity measured.
        self.result(self.load(10, 8, threads=2), "warm-up")
        read_capacity = self.result(self.load(5, 8, threads=2), "read capacity")["throughput"]
        write_capacity = self.result(self.load(5, 8, threads=2, method="io.userstore.Store.Execute",
                                               sql="INSERT INTO log (v) VALUES (?)"), "write capacity")["throughput"]
        read_rate, write_rate, new_rate = a.fraction * 0.7 * read_capacity, a.fraction * 0.25 * write_capacity, 25
        print(f"capacity: reads {read_capacity:.0f}/s, writes {write_capacity:.0f}/s; "
              f"soak at reads {read_rate:.0f}/s, writes {write_rate:.0f}/s, new users {new_rate}/s for {a.minutes} min", flush=True)

        self.began = time.monotonic()
        self.sample()
        stop = threading.Event()
        sampler = threading.Thread(target=self.sampler, args=(stop,))
        sampler.start()
        minutes, version, migrator = [], 1, None
        print("min  reads/s  read p99 µs  writes/s  write p99 µs  new/s  new p99 ms  errors  RSS MiB  fds", flush=True)
        for minute in range(1, a.minutes + 1):
            if minute % 3 == 0 and (migrator is None or not migrator.is_alive()):
                version += 1
                migrator = threading.Thread(target=self.migrate_fleet, args=(version,))
                migrator.start()
            reads = self.load(60, 8, read_rate, threads=1)
            writes = self.load(60, 4, write_rate, method="io.userstore.Store.Execute", sql="INSERT INTO log (v) VALUES (?)")
            news = self.load(60, 2, new_rate, user_format=f"new{minute:02d}-%07d", users=10_000_000)
            r, w, n = self.result(reads, "read"), self.result(writes, "write"), self.result(news, "new-user")
            errors = r["errors"] + w["errors"] + n["errors"]
            if errors:
                self.failures.append(f"minute {minute}: {errors} failed calls")
            self.sample()
            _, rss, fds = self.samples[-1]
            row = {"minute": minute, "reads": r["throughput"], "read_p99_us": r["p99_us"], "writes": w["throughput"],
                   "write_p99_us": w["p99_us"], "new": n["throughput"], "new_p99_ms": n["p99_us"] / 1000, "errors": errors,
                   "rss_mib": round(rss, 1), "fds": fds}
            minutes.append(row)
            print(f"{minute:3d}  {r['throughput']:7.0f}  {r['p99_us']:11.0f}  {w['throughput']:8.0f}  {w['p99_us']:12.0f}  "
                  f"{n['throughput']:5.1f}  {n['p99_us'] / 1000:10.1f}  {errors:6d}  {rss:7.1f}  {fds:4d}", flush=True)
        stop.set()
        sampler.join()
        if migrator:
            migrator.join()
        status = call_once(self.socket, "io.userstore.Admin.Status").get("parameters", {})
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = "hung"
        if code != 0:
            self.failures.append(f"the daemon's exit on SIGTERM: {code}")
        damaged = self.check_stores()

        steady = [(t / 60, rss, fds) for t, rss, fds in self.samples if t >= 60]
        later = minutes[1:] or minutes
        summary = {
            "minutes": a.minutes, "fraction": a.fraction, "read_capacity": round(read_capacity), "write_capacity": round(write_capacity),
            "rss_mib_first": round(self.samples[0][1], 1), "rss_mib_last": round(self.samples[-1][1], 1),
            "rss_mib_per_minute": round(slope([(t, rss) for t, rss, _ in steady]), 2),
            "fds_first": self.samples[0][2], "fds_last": self.samples[-1][2],
            "fds_per_minute": round(slope([(t, fds) for t, _, fds in steady]), 2),
            "read_p99_us_min": min(m["read_p99_us"] for m in later), "read_p99_us_max": max(m["read_p99_us"] for m in later),
            "write_p99_us_min": min(m["write_p99_us"] for m in later), "write_p99_us_max": max(m["write_p99_us"] for m in later),
            "calls": sum(round((m["reads"] + m["writes"] + m["new"]) * 60) for m in minutes),
            "stores": status.get("knownStores"), "fleet_migrations": self.migrations_run, "stores_checked": self.checked,
            "damaged": damaged, "failures": self.failures, "per_minute": minutes,
        }
        print(json.dumps({k: v for k, v in summary.items() if k != "per_minute"}, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(summary, f, indent=1)
        if self.failures or damaged:
            print("soak: FAILED: " + "; ".join(self.failures + [f"{damaged} stores fail integrity_check"]), file=sys.stderr)
            return 1
        if not a.keep:
            shutil.rmtree(self.directory, ignore_errors=True)
        return 0

    def check_stores(self):
        """integrity_check on every soak user's store and on every 50th new one."""
        files = []
        for root, _, names in os.walk(os.path.join(self.directory, "data", "stores")):
            files += [os.path.join(root, n) for n in names if n.endswith(".sqlite")]
        chosen = [f for i, f in enumerate(sorted(files)) if os.path.basename(f).startswith("soak") or i % 50 == 0]
        damaged = 0
        for path in chosen:
            connection = sqlite3.connect(path)
            if connection.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                damaged += 1
            connection.close()
        self.checked = len(chosen)
        return damaged


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daemon", required=True, help="the userstored binary (a release build)")
    parser.add_argument("--load", required=True, help="the userstore-load binary (bench/userstore-load.c)")
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.5, help="share of the measured capacity to run at")
    parser.add_argument("--json", help="write the summary and the per-minute rows here")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    sys.exit(Soak(parser.parse_args()).run())


if __name__ == "__main__":
    main()
