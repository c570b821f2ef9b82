import Foundation

/// The JSON of etcd's v3 gateway, as Codable types: only the fields userstore sends and reads.
/// The gateway (grpc-gateway) writes 64-bit integers as strings, bytes as base64, and leaves
/// zero values out — hence ``Number`` and the optionals.
enum EtcdWire {
    /// A 64-bit integer the gateway writes as a string (and takes either way); absent is 0.
    struct Number: Codable, Sendable {
        let value: Int64

        init(_ value: Int64) {
            self.value = value
        }

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let text = try? container.decode(String.self) {
                guard let value = Int64(text) else {
                    throw DecodingError.dataCorruptedError(in: container, debugDescription: "not an integer: \(text)")
                }
                self.value = value
            } else {
                value = try container.decode(Int64.self)
            }
        }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(String(value))
        }
    }

    struct Header: Decodable {
        let revision: Number?
    }

    struct KeyValue: Decodable {
        let key: String?
        let value: String?
        let create_revision: Number?
        let mod_revision: Number?
        let version: Number?
        let lease: Number?
    }

    // MARK: Requests

    struct Range: Encodable {
        let key: String
        var range_end: String?
    }

    struct Put: Encodable {
        let key: String
        let value: String
        var lease: Number?
    }

    struct DeleteRange: Encodable {
        let key: String
    }

    /// One comparison of a transaction: `CREATE` (`create_revision`), `MOD` (`mod_revision`) or
    /// `LEASE` (`lease`), each compared for equality (the gateway's default).
    struct Compare: Encodable {
        let key: String
        let target: String
        var create_revision: Number?
        var mod_revision: Number?
        var lease: Number?
    }

    /// One operation of a transaction; exactly one field is set.
    struct Operation: Encodable {
        var request_put: Put?
        var request_range: Range?
        var request_delete_range: DeleteRange?
    }

    struct Transaction: Encodable {
        var compare: [Compare]?
        var success: [Operation]?
        var failure: [Operation]?
    }

    struct LeaseGrant: Encodable {
        let TTL: Number
    }

    struct LeaseID: Encodable {
        let ID: Number
    }

    struct Watch: Encodable {
        struct Create: Encodable {
            let key: String
            let range_end: String
            let start_revision: Number
        }

        let create_request: Create
    }

    // MARK: Replies

    /// Every reply's header; replies nothing else is read from decode as this.
    struct Reply: Decodable {
        let header: Header?
    }

    struct RangeReply: Decodable {
        let header: Header?
        let kvs: [KeyValue]?
    }

    struct DeleteRangeReply: Decodable {
        let header: Header?
        let deleted: Number?
    }

    struct TransactionReply: Decodable {
        struct Response: Decodable {
            let response_range: RangeReply?
        }

        let header: Header?
        let succeeded: Bool?
        let responses: [Response]?
    }

    struct LeaseGrantReply: Decodable {
        let ID: Number?
        let TTL: Number?
    }

    struct KeepAliveReply: Decodable {
        struct Result: Decodable {
            let TTL: Number?
        }

        let result: Result?
    }

    /// An error reply: the gRPC code and message (older gateways: `error`).
    struct ErrorReply: Decodable {
        let code: Number?
        let message: String?
        let error: String?
    }

    /// One line of a watch's stream: a result, or an error.
    struct WatchReply: Decodable {
        struct Result: Decodable {
            let events: [Event]?
            let canceled: Bool?
            let cancel_reason: String?
            let compact_revision: Number?
        }

        struct Event: Decodable {
            let type: String?
            let kv: KeyValue?
        }

        let result: Result?
        let code: Number?
        let message: String?
    }
}
