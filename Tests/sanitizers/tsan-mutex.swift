// Shows that ThreadSanitizer on Linux cannot see Synchronization.Mutex (Swift 6.3.1): two
// threads append to an array only inside Mutex.withLock, which is correct, and TSan reports a
// "Swift access race". Not part of the package; run:
//   swiftc -sanitize=thread -O Tests/sanitizers/tsan-mutex.swift -o /tmp/tsan-mutex && /tmp/tsan-mutex
import Foundation
import Synchronization

final class Box: Sendable { let values = Mutex<[Int]>([]) }
let box = Box()
let group = DispatchGroup()
for thread in 0..<2 {
    group.enter()
    Thread {
        for index in 0..<10_000 { box.values.withLock { $0.append(index + thread) } }
        group.leave()
    }.start()
}
group.wait()
print(box.values.withLock { $0.count }) // always 20000
