import Crypto
import Foundation
import Testing
@testable import UserStoreCore

/// ``StoreKeyring``: data keys made and wrapped in a folder key store, the key-encryption key
/// checked, erase by tombstone, a store key's rotation, and the key-encryption key's rotation
/// (rewrap), interrupted and resumed.
struct StoreKeyringTests {
    /// A page sealed with `sealing` opens with `opening`: the same data key.
    static func sameKey(_ sealing: PageCipher, _ opening: PageCipher) -> Bool {
        var plain = [UInt8](repeating: 7, count: 4096), stored = [UInt8](repeating: 0, count: 4096)
        for index in 4064..<4096 { plain[index] = 0 }
        do {
            try plain.withUnsafeBytes { from in try stored.withUnsafeMutableBytes { try sealing.seal(page: 2, plain: from, into: $0) } }
            try stored.withUnsafeBytes { from in try plain.withUnsafeMutableBytes { try opening.open(page: 2, stored: from, into: $0) } }
            return true
        } catch {
            return false
        }
    }

    struct Interrupted: Error {}

    @Test func keysAreMadeOnceCheckedErasedAndRewrappedUnderANewKeyEncryptionKey() async throws {
        // On the blocking pool's threads: in a mixed run, the synchronous suites beside it hold
        // Swift's cooperative pool, and each await waited seconds for a thread (80 s in all).
        try await BlockingPool.executing { try await Self.makeCheckEraseAndRewrap() }
    }

    private static func makeCheckEraseAndRewrap() async throws {
        let directory = try TemporaryDirectory()
        let store = FolderKeyStore(root: try directory.folder("keys"))
        let old = SymmetricKey(size: .bits256), new = SymmetricKey(size: .bits256)
        let keyring = StoreKeyring(keyEncryptionKey: old, store: store)
        try await keyring.verify() // a new key store: its check record is written
        let users = try ["alice", "bob", "carol", "dave"].map { try UserID($0) }
        var ciphers: [UserID: PageCipher] = [:]
        for user in users { ciphers[user] = try await keyring.cipher(for: user, create: true) }
        #expect(Self.sameKey(ciphers[users[0]]!, try await keyring.cipher(for: users[0], create: true)), "a second call made another key")
        #expect(!Self.sameKey(ciphers[users[0]]!, ciphers[users[1]]!))
        await #expect(throws: StoreError.storeKeyMissing(user: try UserID("erin"), message: "the key store file://\(directory.path)/keys holds no data key of the user")) {
            try await keyring.cipher(for: try UserID("erin"), create: false)
        }
        try await keyring.destroy(users[3])
        await #expect(throws: StoreError.storeErased(user: users[3])) { try await keyring.cipher(for: users[3], create: false) }
        // Bob's store key is being rotated: his record holds two keys.
        let (_, bobNext) = try await keyring.beginRotation(of: users[1])
        await #expect(throws: StoreKeyring.SetupError.wrongKey(location: store.location)) { try await StoreKeyring(keyEncryptionKey: new, store: store).verify() }

        // The rotation of the key-encryption key, cut short after the first record.
        await #expect(throws: Interrupted.self) {
            try await keyring.rewrap(to: new) { done, _ in if done == 1 { throw Interrupted() } }
        }
        await #expect(throws: StoreKeyring.SetupError.rotationUnderWay(location: store.location)) { try await keyring.verify() }
        var seen: (Int, Int) = (0, 0)
        let rewrapped = try await keyring.rewrap(to: new) { seen = ($0, $1) }
        #expect((2...3).contains(rewrapped) && seen == (4, 4), "\(rewrapped) rewrapped, progress \(seen)") // the first record was done before (dave: a tombstone)
        let rotated = StoreKeyring(keyEncryptionKey: new, store: store)
        try await rotated.verify()
        await #expect(throws: StoreKeyring.SetupError.wrongKey(location: store.location)) { try await keyring.verify() }
        for user in users.prefix(3) {
            #expect(Self.sameKey(ciphers[user]!, try await rotated.cipher(for: user, create: false)), "\(user)'s data key changed")
        }
        let bob = try await rotated.ciphers(for: users[1])
        #expect(bob.next.map { Self.sameKey(bobNext, $0) } == true, "bob's next key was lost")
        await #expect(throws: StoreError.storeErased(user: users[3])) { try await rotated.cipher(for: users[3], create: false) }
        #expect(try await rotated.rewrap(to: new) == 0) // finished: nothing left to do
    }
}
