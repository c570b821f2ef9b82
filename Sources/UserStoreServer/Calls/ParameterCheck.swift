import Foundation
import UserStoreInterface
import Varlink

/// The checks every call's parameters pass before anything runs, on every path (fast path,
/// transactions, forwarding, the router): a parameter the method does not define, and an
/// integer outside the signed 64-bit range anywhere in the parameters, are
/// `org.varlink.service.InvalidParameter` naming it. A typo in an optional parameter
/// (`durabel`) must not silently do the default, and an integer must not come back as a real.
enum ParameterCheck {
    /// The parameter at fault in the call in `view` of `method`, or nil when every one is fine.
    static func invalidParameter(_ view: JSONView, _ method: Method) -> String? {
        guard let parameters = view.member("parameters", of: 0), view.kind(parameters) == .object else { return nil }
        let defined = method.definedParameters
        var fault: String?
        view.forEachMember(of: parameters) { name, value in
            guard fault == nil else { return }
            let known = view.withStringBytes(name) { bytes in defined.contains { $0.utf8.elementsEqual(bytes) } }
            if !known {
                fault = InputQuote.prefix(view.string(name))
            } else if let path = outOfRange(view, value) {
                fault = view.string(name) + path
            }
        }
        return fault
    }

    /// The path (`[0]`, `.id`, empty for the value itself) of the first integer at or under
    /// `index` that does not fit 64 bits (a number without fraction or exponent that JSONView
    /// cannot read as an integer), or nil.
    static func outOfRange(_ view: JSONView, _ index: Int) -> String? {
        switch view.kind(index) {
        case .number:
            return view.isOutOfRangeInteger(index) ? "" : nil
        case .array:
            var path: String?
            view.forEachElement(of: index) { offset, element in
                if path == nil, let inner = outOfRange(view, element) { path = "[\(offset)]" + inner }
            }
            return path
        case .object:
            var path: String?
            view.forEachMember(of: index) { name, member in
                if path == nil, let inner = outOfRange(view, member) { path = "." + view.string(name) + inner }
            }
            return path
        default:
            return nil
        }
    }
}

extension Method {
    /// The parameters the method's line in its interface file defines.
    var definedParameters: [String] { Self.parameterTable[self] ?? [] }

    /// Every method's parameters, read once from the interface descriptions the daemon serves.
    private static let parameterTable: [Method: [String]] = {
        var table: [Method: [String]] = [:]
        for (interface, description) in DaemonInfo.interfaces {
            for (name, parameters) in InterfaceText.methodParameters(description) {
                if let method = Method(rawValue: interface + "." + name) { table[method] = parameters }
            }
        }
        return table
    }()
}

/// Reads the method signatures of a varlink interface description.
enum InterfaceText {
    /// Each `method Name(a: T, b: ?U) -> (...)`'s name and input field names (comments skipped).
    static func methodParameters(_ description: String) -> [(name: String, parameters: [String])] {
        let text = description.split(separator: "\n", omittingEmptySubsequences: false)
            .map { line in line.firstIndex(of: "#").map { line[..<$0] } ?? line }
            .joined(separator: "\n")
        var methods: [(String, [String])] = []
        var rest = Substring(text)
        while let keyword = rest.range(of: "method ") {
            rest = rest[keyword.upperBound...]
            guard let open = rest.firstIndex(of: "(") else { break }
            let name = rest[..<open].trimmingCharacters(in: .whitespacesAndNewlines)
            var depth = 0
            var field = ""
            var fields: [String] = []
            var index = open
            scan: while index < rest.endIndex {
                let character = rest[index]
                switch character {
                case "(":
                    depth += 1
                    if depth > 1 { field.append(character) }
                case ")":
                    depth -= 1
                    if depth == 0 { fields.append(field); break scan }
                    field.append(character)
                case "," where depth == 1:
                    fields.append(field)
                    field = ""
                default:
                    field.append(character)
                }
                index = rest.index(after: index)
            }
            let names = fields.compactMap { field -> String? in
                guard let colon = field.firstIndex(of: ":") else { return nil }
                let name = field[..<colon].trimmingCharacters(in: .whitespacesAndNewlines)
                return name.isEmpty ? nil : name
            }
            methods.append((name, names))
            rest = index < rest.endIndex ? rest[index...] : ""
        }
        return methods
    }
}
