import Foundation
import GRDBSQLite
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// `io.userstore.Admin` for a store's whole life: DeleteStore, ExportStore, ImportStore,
/// ListBackups, RestoreStore, RotateStoreKey.
struct StoreLifecycleMethods {
    let context: DaemonContext
    private var registry: StoreRegistry { context.registry }

    /// Handles `request`, a call of `method` (one of these).
    func handle(_ method: Method, _ request: Request, send: @escaping ReplySink) async throws {
        let parameters = request.parameters
        switch method {
        case .deleteStore:
            let user = try parameters.user()
            let report = try await registry.lifecycle.delete(user, keepBackups: try parameters.optionalBool("keepBackups") ?? false)
            try await send(VarlinkReply.encode(["user": .string(user.rawValue), "existed": .bool(report.existed),
                                                "removedFiles": .array(report.removedFiles.map { .string($0) })]))
        case .exportStore:
            guard request.more else { throw VarlinkError.expectedMore() }
            try await export(try parameters.user(), format: try parameters.optionalString("format") ?? "sqlite", send: send)
        case .importStore:
            try await send(importStore(request, parameters))
        case .listBackups:
            let user = try parameters.user()
            try await send(VarlinkReply.encode(["backups": .array(registry.lifecycle.backups(of: user).map(Self.fields))]))
        case .restoreStore:
            let user = try parameters.user()
            let (restored, previous) = try await registry.lifecycle.restore(user, backup: try parameters.string("backup"))
            var fields: [String: JSONValue] = ["user": .string(user.rawValue), "backup": Self.fields(restored), "schemaVersion": .integer(restored.schemaVersion)]
            if let previous { fields["previous"] = .string(previous) }
            try await send(VarlinkReply.encode(fields))
        case .rotateStoreKey:
            let user = try parameters.user()
            guard let keyring = registry.configuration.keyring else {
                throw VarlinkError.invalidRequest("encryption is off (no encryption section in the configuration): there is no key to rotate")
            }
            let started = ContinuousClock.now
            let pages = try await registry.lifecycle.rotateKey(user, keyring: keyring)
            context.logger.notice("store key rotated", metadata: [
                "event": "store-key-rotated", "user": .string(user.rawValue), "pages": "\(pages)",
                "duration_us": "\((ContinuousClock.now - started).wholeMicroseconds)",
            ])
            try await send(VarlinkReply.encode(["user": .string(user.rawValue), "pages": .integer(Int64(pages))]))
        default:
            throw VarlinkError.methodNotFound(request.name)
        }
    }

    static func fields(_ backup: BackupInfo) -> JSONValue {
        ["path": .string(backup.path), "takenAt": .string(backup.takenAt), "schemaVersion": .integer(backup.schemaVersion),
         "reason": .string(backup.reason.rawValue), "bytes": .integer(backup.bytes)]
    }

    // MARK: Import

    private func importStore(_ request: Request, _ parameters: CallParameters) async throws -> [UInt8] {
        let user = try parameters.user()
        let source: ImportSource
        var passed: Int32?
        if let path = try parameters.optionalString("path") {
            source = .path(path)
        } else {
            let index = Int(try parameters.optionalInt("fileDescriptor") ?? 0)
            guard let descriptor = request.descriptors.take(index) else {
                throw VarlinkError.invalidParameter("path: pass the file as a descriptor with the call (SCM_RIGHTS) or a path the daemon can read")
            }
            passed = descriptor
            source = .descriptor(descriptor)
        }
        defer { if let passed { close(passed) } }
        let report = try await registry.lifecycle.importStore(user, from: source, schemaVersion: try parameters.optionalInt("schemaVersion"),
                                                    replace: try parameters.optionalBool("replace") ?? false)
        var fields: [String: JSONValue] = ["user": .string(user.rawValue), "schemaVersion": .integer(report.schemaVersion),
                                           "replaced": .bool(report.replaced), "keptBookkeeping": .bool(report.keptBookkeeping)]
        if let backup = report.backup { fields["backup"] = .string(backup) }
        return VarlinkReply.encode(fields)
    }

    // MARK: Export

    /// Raw bytes per `sqlite` chunk: 768 KiB, so that its base64 stays within 1 MiB.
    static let chunkBytes = 786_432
    /// A `json` reply is sent once its rows reach about this size.
    static let jsonReplyBytes = 1 << 20

    /// Streams a consistent copy of `user`'s store (as it is, not migrated first).
    private func export(_ user: UserID, format: String, send: @escaping ReplySink) async throws {
        guard format == "sqlite" || format == "json" else { throw VarlinkError.invalidParameter("format") }
        let copy = context.configuration.registryConfiguration.layout.stagingDirectory + "/export.\(UUID().uuidString.lowercased()).sqlite"
        try FileManager.default.createDirectory(atPath: (copy as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        defer { unlink(copy) }
        // Plaintext, as exports are (an encrypted store's copy lives in the staging folder, in
        // plaintext, only while it streams).
        let version = try await registry.lifecycle.snapshot(user, to: copy, plaintext: true)
        var stream = ReplyStream(send: send)
        if format == "sqlite" {
            try await exportFile(copy, into: &stream)
        } else {
            try await exportTables(copy, user: user, into: &stream)
        }
        try await stream.finish()
        let bytes = (try? FileManager.default.attributesOfItem(atPath: copy)[.size] as? Int) ?? 0
        context.logger.notice("store exported as \(format)", metadata: [
            "event": "store-exported", "user": .string(user.rawValue), "format": .string(format),
            "schema_version": "\(version)", "bytes": "\(bytes)",
        ])
    }

    private func exportFile(_ path: String, into stream: inout ReplyStream) async throws {
        guard let file = FileHandle(forReadingAtPath: path) else { throw VarlinkError(.storageFailure, ["user": "", "message": "cannot read the copy"]) }
        defer { try? file.close() }
        while let chunk = try file.read(upToCount: Self.chunkBytes), !chunk.isEmpty {
            try await stream.reply(["chunk": .string(chunk.base64EncodedString())])
        }
    }

    /// One reply per table (more for large ones): `{table, columns, rows}`.
    private func exportTables(_ path: String, user: UserID, into stream: inout ReplyStream) async throws {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READONLY, nil) == SQLITE_OK, let connection else {
            throw StoreError.storeDamaged(user: user, message: "the export copy cannot be opened")
        }
        let tables = try Self.strings(connection, "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")
        for table in tables {
            var statement: OpaquePointer?
            let quoted = "\"" + table.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            guard sqlite3_prepare_v2(connection, "SELECT * FROM \(quoted)", -1, &statement, nil) == SQLITE_OK, let statement else {
                throw StoreError.storeDamaged(user: user, message: "table \(table): \(String(cString: sqlite3_errmsg(connection)))")
            }
            defer { sqlite3_finalize(statement) }
            let columns = (0..<sqlite3_column_count(statement)).map { JSONValue.string(String(cString: sqlite3_column_name(statement, $0))) }
            var writer = JSONWriter(capacity: 4096)
            var rows = 0
            func flush() async throws {
                let rowsJSON = "[" + String(decoding: writer.bytes, as: UTF8.self) + "]"
                try await stream.replyRaw(table: table, columns: columns, rowsJSON: rowsJSON)
                writer = JSONWriter(capacity: 4096)
                rows = 0
            }
            var code = sqlite3_step(statement)
            while code == SQLITE_ROW {
                if rows > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                writer.raw(byte: UInt8(ascii: "["))
                for column in 0..<sqlite3_column_count(statement) {
                    if column > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                    ValueWriter.write(column: column, of: statement, into: &writer)
                }
                writer.raw(byte: UInt8(ascii: "]"))
                rows += 1
                if writer.bytes.count >= Self.jsonReplyBytes { try await flush() }
                code = sqlite3_step(statement)
            }
            guard code == SQLITE_DONE else { throw StoreError.storeDamaged(user: user, message: "table \(table): \(String(cString: sqlite3_errmsg(connection)))") }
            if rows > 0 || !stream.sentTable(table) { try await flush() }
        }
    }

    private static func strings(_ connection: OpaquePointer, _ sql: String) throws -> [String] {
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(connection, sql, -1, &statement, nil) == SQLITE_OK else { return [] }
        var values: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW { values.append(String(cString: sqlite3_column_text(statement, 0))) }
        return values
    }
}

/// Sends a streamed reply (`more`): every reply but the last with `continues: true`, which
/// needs each to be held until the next one is known.
struct ReplyStream {
    let send: ReplySink
    private var held: [UInt8]?
    private var tables: Set<String> = []

    init(send: @escaping ReplySink) {
        self.send = send
    }

    /// Queues a reply with `parameters`.
    mutating func reply(_ parameters: [String: JSONValue]) async throws {
        try await hold(VarlinkReply.encode(parameters, continues: true))
    }

    /// Queues `{"table": …, "columns": […], "rows": <rowsJSON>}`.
    mutating func replyRaw(table: String, columns: [JSONValue], rowsJSON: String) async throws {
        tables.insert(table)
        var writer = JSONWriter(capacity: rowsJSON.utf8.count + 256)
        VarlinkReply.encode(continues: true, into: &writer) { writer in
            writer.raw("{\"table\":")
            writer.write(table)
            writer.raw(",\"columns\":")
            writer.write(.array(columns))
            writer.raw(",\"rows\":")
            writer.bytes.append(contentsOf: rowsJSON.utf8)
            writer.raw(byte: UInt8(ascii: "}"))
        }
        try await hold(writer.bytes)
    }

    /// Whether a reply for `table` was queued.
    func sentTable(_ table: String) -> Bool { tables.contains(table) }

    private mutating func hold(_ bytes: [UInt8]) async throws {
        if let previous = held { try await send(previous) }
        held = bytes
    }

    /// Sends the last reply, without `continues` (an empty one if there was none).
    mutating func finish() async throws {
        guard var last = held else { return try await send(VarlinkReply.encode([:])) }
        // Drop `,"continues":true` from the held reply: it is the last.
        let marker = Array(",\"continues\":true}".utf8)
        if last.count > marker.count + 1, Array(last[(last.count - 1 - marker.count)..<(last.count - 1)]) == marker {
            last.replaceSubrange((last.count - 1 - marker.count)..<(last.count - 1), with: Array("}".utf8))
        }
        held = nil
        try await send(last)
    }
}
