import Foundation
import Testing
import UserStoreInterface
import Varlink
@testable import UserStoreServer

/// The daemon's one method table (``Method``) is the interface files' list of methods: a
/// method added to a file and not to the table (or the other way round) fails here.
struct MethodTableTests {
    /// `interface name` → its `method` names, read from each interface description the daemon
    /// serves (`Interfaces/*.varlink`, and org.varlink.service's own) by the reader the
    /// parameter check uses.
    static func declaredMethods() -> [String: Set<String>] {
        DaemonInfo.interfaces.mapValues { Set(InterfaceText.methodParameters($0).map(\.name)) }
    }

    @Test func theTableHoldsExactlyTheMethodsOfTheInterfaceFiles() {
        let declared = Self.declaredMethods()
        #expect(Set(declared.keys) == Set(Method.Interface.allCases.map(\.rawValue)))
        for interface in Method.Interface.allCases {
            let table = Set(Method.allCases.filter { $0.interface == interface }.map { String($0.member) })
            #expect(table == declared[interface.rawValue], "\(interface.rawValue): table \(table.sorted()), file \((declared[interface.rawValue] ?? []).sorted())")
        }
    }

    /// The shared error table (``ErrorName``, which the client and userstorectl compare with) is
    /// the interface files' list of errors.
    @Test func theErrorTableHoldsExactlyTheErrorsOfTheInterfaceFiles() {
        var declared: Set<String> = []
        for (interface, text) in DaemonInfo.interfaces where interface.hasPrefix("io.userstore.") {
            for line in text.split(separator: "\n") where line.hasPrefix("error ") {
                declared.insert(interface + "." + line.dropFirst(6).prefix { $0.isLetter || $0.isNumber })
            }
        }
        let table = Set(ErrorName.allCases.map(\.rawValue))
        #expect(table == declared, "only in the table: \(table.subtracting(declared).sorted()); only in the files: \(declared.subtracting(table).sorted())")
        #expect(ErrorName.sqlError.short == "SQLError")
    }

    /// The parameters each method accepts are its interface line's, nested types and comments
    /// notwithstanding.
    @Test func everyMethodsParametersAreItsInterfaceLinesInputs() {
        #expect(Method.query.definedParameters == ["user", "sql", "parameters", "transaction"])
        #expect(Method.batch.definedParameters == ["user", "statements", "transaction", "durable"])
        #expect(Method.status.definedParameters.isEmpty)
        #expect(Method.queryStores.definedParameters == ["sql", "parameters", "users", "all", "state", "cohort", "parallel", "timeoutMilliseconds"])
        #expect(Method.getInterfaceDescription.definedParameters == ["interface"])
        #expect(Method.allCases.allSatisfy { !$0.definedParameters.contains { $0.contains(" ") || $0.contains("#") } })
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
