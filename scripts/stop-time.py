#!/usr/bin/env python3
"""How long `userstored` takes to stop (SIGTERM to exit) with many stores open.

For each binary given (alternating, ROUNDS times): a fresh data directory, USERS users each
written once (so each store is open, with a commit), then SIGTERM. With --replica a `file://`
replica; with --outage its log folder is made unwritable after the first writes and each user
written again, so that every store holds commits the log could not store when the stop begins.
Prints one line per run. Usage:
  python3 scripts/stop-time.py [--users 1000] [--rounds 3] [--replica] [--outage] BINARY [BINARY...]
`make stop-time OLD=<git revision>` compares a revision's release build with the tree's.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import varlink_client as v  # noqa: E402

MIGRATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config", "migrations")


def run(binary, users, replica, outage):
    """One run: the seconds from SIGTERM to exit, and the exit status."""
    root = tempfile.mkdtemp(prefix="userstore-stop-")
    try:
        os.makedirs(root + "/replica")
        config = (f'appVersion: "2.0.0"\ndataDirectory: {root}/data\nsocketPath: {root}/sock\n'
                  f"migrationsDirectory: {os.path.abspath(MIGRATIONS)}\nmaxOpenStores: {max(users, 64)}\n")
        if replica:
            config += f'replication:\n  replica: "file://{root}/replica"\n'
        with open(root + "/userstored.yaml", "w") as f:
            f.write(config)
        with open(root + "/stderr", "w") as stderr:
            daemon = subprocess.Popen([binary, "--config", root + "/userstored.yaml"], stderr=stderr)
        sock = v.connect(root + "/sock", call_timeout=60)

        def write_each(title):
            for i in range(users):
                reply = v.call(sock, "io.userstore.Store.Execute", user=f"u{i}", sql=f"INSERT INTO notes (title) VALUES ('{title}')")
                assert "error" not in reply, reply

        write_each("first")
        if outage:
            os.rename(root + "/replica/log", root + "/replica/log.aside")
            with open(root + "/replica/log", "w") as f:
                f.write("in the way")
            write_each("during the outage")
        started = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=900)
        return time.monotonic() - started, status
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replica", action="store_true")
    parser.add_argument("--outage", action="store_true")
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    for round_ in range(args.rounds):
        for binary in args.binaries:
            seconds, status = run(binary, args.users, args.replica or args.outage, args.outage)
            print(f"round {round_ + 1} {binary}: {args.users} users, replica {'outage' if args.outage else args.replica}: "
                  f"stop took {seconds:.2f} s, exit {status}", flush=True)


if __name__ == "__main__":
    main()
