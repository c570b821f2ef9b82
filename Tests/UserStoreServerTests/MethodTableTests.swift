import Foundation
import Testing
import Varlink
@testable import UserStoreServer

/// The daemon's one method table (``Method``) is the interface files' list of methods: a
/// method added to a file and not to the table (or the other way round) fails here.
struct MethodTableTests {
    /// `interface name` → its `method` names, read from each interface description the daemon
    /// serves (`Interfaces/*.varlink`, and org.varlink.service's own).
    static func declaredMethods() -> [String: Set<String>] {
        var declared: [String: Set<String>] = [:]
        for (interface, description) in DaemonInfo.interfaces {
            let methods = description.split(separator: "\n").compactMap { line -> String? in
                let words = line.trimmingCharacters(in: .whitespaces).split(separator: " ", maxSplits: 1)
                guard words.count == 2, words[0] == "method" else { return nil }
                return String(words[1].prefix { $0.isLetter || $0.isNumber })
            }
            declared[interface] = Set(methods)
        }
        return declared
    }

    @Test func theTableHoldsExactlyTheMethodsOfTheInterfaceFiles() {
        let declared = Self.declaredMethods()
        #expect(Set(declared.keys) == Set(Method.Interface.allCases.map(\.rawValue)))
        for interface in Method.Interface.allCases {
            let table = Set(Method.allCases.filter { $0.interface == interface }.map { String($0.member) })
            #expect(table == declared[interface.rawValue], "\(interface.rawValue): table \(table.sorted()), file \((declared[interface.rawValue] ?? []).sorted())")
        }
    }

    @Test func everyMethodIsFoundByItsNameAndReadInPlace() throws {
        var tape = JSONTape(maxDepth: 8)
        for method in Method.allCases {
            #expect(Method(rawValue: method.rawValue) == method)
            let bytes = Array(#"{"method":"\#(method.rawValue)"}"#.utf8)
            try bytes.withUnsafeBufferPointer { buffer in
                try tape.parse(buffer)
                #expect(tape.withView(buffer) { Method.of($0) } == method)
            }
        }
        #expect(Method(rawValue: "io.userstore.Store.Nope") == nil)
        #expect(Method(rawValue: "io.userstore.Store") == nil)
    }
}
