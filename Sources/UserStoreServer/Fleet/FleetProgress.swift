import Varlink

/// Progress of a fleet operation, reported in every reply.
struct FleetProgress {
    var done = 0
    var total: Int
    var failures = 0
    var migrated = 0
    var failed: [JSONValue] = []

    var fields: [String: JSONValue] {
        ["done": .integer(Int64(done)), "total": .integer(Int64(total)), "failures": .integer(Int64(failures)), "migrated": .integer(Int64(migrated))]
    }
}
