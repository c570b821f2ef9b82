import Foundation
import Testing
import Varlink

@Suite struct UnixSocketAddressTests {
    @Test func holdsThePathNulTerminated() {
        let seen = UnixSocketAddress.with(path: "/run/userstore/userstore.sock") { address, length in
            address.withMemoryRebound(to: sockaddr_un.self, capacity: 1) { un -> (Int32, [UInt8], Int) in
                let path = withUnsafeBytes(of: un.pointee.sun_path) { Array($0.prefix(30)) }
                return (Int32(un.pointee.sun_family), path, Int(length))
            }
        }
        #expect(seen?.0 == AF_UNIX)
        #expect(seen?.1 == Array("/run/userstore/userstore.sock".utf8) + [0])
        #expect(seen?.2 == MemoryLayout<sockaddr_un>.size)
    }

    @Test func refusesAPathLongerThanSunPath() {
        #expect(UnixSocketAddress.with(path: String(repeating: "a", count: 107)) { _, _ in true } == true)
        #expect(UnixSocketAddress.with(path: String(repeating: "a", count: 108)) { _, _ in true } == nil)
    }
}
