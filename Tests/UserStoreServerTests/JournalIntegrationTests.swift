import DaemonTestSupport
import Foundation
import Testing
import UserStoreJournal

/// Layer 2: the real daemon logging to a real systemd-journald (in a private mount namespace),
/// read back with journalctl.
@Suite(.serialized) struct JournalIntegrationTests {
    static let secret = "SECRET-PARAMETER-7f3a9c"

    @Test(.timeLimit(.minutes(10)))
    func migrationsAppearAsStructuredEntriesWithCatalogText() throws {
        let daemon = try DaemonHarness(migrations: [
            "0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT);",
            "0002_tags.sql": "CREATE TABLE tags (name TEXT);",
            "0003_pinned.sql": "ALTER TABLE notes ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;",
        ], extraConfig: "slowRequestMilliseconds: 1")
        let root = daemon.directory.path
        let journal = root + "/journal"
        try FileManager.default.createDirectory(atPath: journal, withIntermediateDirectories: true)
        try "[Journal]\nStorage=persistent\nReadKMsg=no\nRateLimitBurst=0\nForwardToSyslog=no\nForwardToWall=no\n"
            .write(toFile: root + "/journald.conf", atomically: true, encoding: .utf8)
        let client = """
            import json, socket, sys, os
            sock, migrations, secret = sys.argv[1:4]
            s = socket.socket(socket.AF_UNIX); s.connect(sock)
            def call(method, **parameters):
                s.sendall(json.dumps({"method": method, "parameters": parameters}).encode() + b"\\0")
                reply = b""
                while not reply.endswith(b"\\0"): reply += s.recv(65536)
                return json.loads(reply[:-1])
            print(call("io.userstore.Store.Open", user="jay"))
            print(call("io.userstore.Store.Execute", user="jay", sql="INSERT INTO notes (title) VALUES (?)", parameters=[secret]))
            with open(os.path.join(migrations, "0004_broken.sql"), "w") as f: f.write("INSERT INTO missing_table VALUES (1);")
            print(call("io.userstore.Admin.Reload"))
            print(call("io.userstore.Store.Open", user="jay"))
            """
        try client.write(toFile: root + "/client.py", atomically: true, encoding: .utf8)
        let script = """
            set -e
            mount -t tmpfs tmpfs /run/systemd
            mount -t tmpfs tmpfs /run/log
            mount --bind "$JOURNAL" /var/log/journal
            mount --bind "$ROOT/journald.conf" /etc/systemd/journald.conf
            mkdir -p /run/systemd/journal && touch /run/systemd/journal/flushed
            /lib/systemd/systemd-journald & J=$!
            for i in $(seq 3000); do [ -S /run/systemd/journal/socket ] && break; sleep 0.01; done
            [ -S /run/systemd/journal/socket ]
            "$DAEMON" --config "$CONFIG" --log-target journal & D=$!
            for i in $(seq 3000); do [ -S "$SOCKET" ] && break; kill -0 $D; sleep 0.01; done
            [ -S "$SOCKET" ]
            python3 "$ROOT/client.py" "$SOCKET" "$MIGRATIONS" "$SECRET" > "$ROOT/client.out"
            kill -TERM $D; wait $D
            journalctl --sync; kill $J; wait $J || true
            """
        let result = try run(["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/bash", "-c", script], environment: [
            "JOURNAL": journal, "ROOT": root, "DAEMON": productsDirectory + "/userstored", "CONFIG": daemon.configPath,
            "SOCKET": daemon.socketPath, "MIGRATIONS": daemon.migrationsDirectory, "SECRET": Self.secret,
        ])
        #expect(result.status == 0, "\(result.stderr)")

        let json = try run(["/usr/bin/journalctl", "-D", journal, "-o", "json", "--no-pager", "SYSLOG_IDENTIFIER=userstored"])
        let all = json.stdout.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        func entries(_ event: JournalEvent) -> [[String: Any]] { all.filter { $0["MESSAGE_ID"] as? String == event.messageID } }

        #expect(entries(.daemonStarting).count == 1 && entries(.daemonReady).count == 1 && entries(.daemonStopping).count == 1)
        let started = entries(.migrationStarted)
        // 0 → 3 on the first Open, then 3 → 4 (which fails) after the reload.
        #expect(started.compactMap { $0["USERSTORE_FROM_VERSION"] as? String } == ["0", "3"])
        #expect(started.compactMap { $0["USERSTORE_TO_VERSION"] as? String } == ["3", "4"])
        #expect(started.compactMap { $0["USERSTORE_STEPS"] as? String } == ["3", "1"])
        let steps = entries(.migrationStep)
        #expect(steps.count == 3)
        #expect(Set(steps.compactMap { $0["USERSTORE_MIGRATION"] as? String }) == ["0001_notes.sql", "0002_tags.sql", "0003_pinned.sql"])
        #expect(steps.compactMap { $0["USERSTORE_STEP"] as? String } == ["1", "2", "3"])
        #expect(steps.allSatisfy { $0["USERSTORE_STEPS"] as? String == "3" && Int($0["USERSTORE_DURATION_USEC"] as? String ?? "") != nil })
        #expect(entries(.migrationFinished).count == 1)
        let failed = entries(.migrationFailed)
        #expect(failed.count == 1)
        #expect((failed.first?["USERSTORE_SQLITE_MESSAGE"] as? String)?.contains("no such table: missing_table") == true)
        #expect(failed.first?["USERSTORE_MIGRATION"] as? String == "0004_broken.sql")
        #expect(failed.first?["PRIORITY"] as? String == "3")
        for entry in started + steps + entries(.migrationFinished) + failed + entries(.storeCreated) {
            #expect(entry["USERSTORE_USER"] as? String == "jay")
        }
        #expect(!entries(.slowRequest).isEmpty)
        // Users' data never reaches the journal.
        let export = try run(["/usr/bin/journalctl", "-D", journal, "-o", "export", "--no-pager"])
        #expect(!export.stdout.contains(Self.secret))
        #expect(export.stdout.contains("USERSTORE_USER=jay"))

        // The catalog compiles into a temporary catalog database, and journalctl -x shows its
        // text under the migration-failed entry.
        let catalogRoot = root + "/catalog-root"
        try FileManager.default.createDirectory(atPath: catalogRoot + "/usr/lib/systemd/catalog", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: repositoryRoot + "/systemd/userstored.catalog", toPath: catalogRoot + "/usr/lib/systemd/catalog/userstored.catalog")
        let update = try run(["/usr/bin/journalctl", "--root=\(catalogRoot)", "--update-catalog"])
        #expect(update.status == 0 && update.stderr.isEmpty, "\(update.stderr)")
        let listed = try run(["/usr/bin/journalctl", "--root=\(catalogRoot)", "--list-catalog"])
        for event in JournalEvent.allCases { #expect(listed.stdout.contains(event.messageID)) }
        let explained = try run(["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                                 "mount --bind \"$0/var/lib/systemd/catalog\" /var/lib/systemd/catalog && exec journalctl -D \"$1\" -x --no-pager MESSAGE_ID=\(JournalEvent.migrationFailed.messageID)",
                                 catalogRoot, journal])
        #expect(explained.stdout.contains("It was rolled back completely"), "\(explained.stdout)\(explained.stderr)")
        #expect(explained.stdout.contains("userstorectl sql jay"))
    }
}
