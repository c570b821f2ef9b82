import Foundation
import Testing
import UserStoreCore

/// The daemon's free-page returner (``MallocSettings/returnFreePages()``): memory freed between
/// live allocations stays resident in glibc's heap until it is handed back — the growth
/// `make churn` showed as stores were opened and closed (docs/replication.md, "Many users").
struct MallocSettingsTests {
    /// Blocks freed between live ones: their pages stay resident after `free`, and go back
    /// to the system once the returner runs. Residency is read per page (`mincore`), of these
    /// blocks only, so other tests allocating meanwhile do not blur it.
    @Test func pagesFreedBetweenLiveAllocationsGoBackToTheSystem() throws {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let blockSize = 32 * 1024 // below malloc's mmap threshold: from its heap
        var blocks: [UnsafeMutableRawPointer] = []
        for _ in 0..<512 {
            let block = try #require(malloc(blockSize))
            memset(block, 0xA5, blockSize)
            blocks.append(block)
        }
        // Every other block stays live between the freed ones: they cannot merge into the heap's
        // top, which free() would hand back by itself.
        let kept = blocks.enumerated().filter { $0.offset % 2 == 1 }.map(\.element)
        blocks = blocks.enumerated().filter { $0.offset % 2 == 0 }.map(\.element)
        defer { kept.forEach { free($0) } }
        // The whole pages inside each block (its first bytes become malloc's bookkeeping once freed).
        let interiors = blocks.map { block -> (UnsafeMutableRawPointer, Int) in
            let start = (Int(bitPattern: block) + page) / page * page + page
            let end = (Int(bitPattern: block) + blockSize) / page * page
            return (UnsafeMutableRawPointer(bitPattern: start)!, max(0, end - start))
        }
        func residentShare() -> Double {
            var resident = 0, total = 0
            for (start, length) in interiors where length > 0 {
                var vector = [UInt8](repeating: 0, count: length / page)
                guard mincore(start, length, &vector) == 0 else { continue }
                resident += vector.filter { $0 & 1 == 1 }.count
                total += vector.count
            }
            return total == 0 ? 0 : Double(resident) / Double(total)
        }
        blocks.forEach { free($0) }
        let afterFree = residentShare()
        #expect(afterFree > 0.9, "free() alone kept \(afterFree) of the pages resident")
        MallocSettings.returnFreePages()
        let afterReturn = residentShare()
        #expect(afterReturn < 0.5, "after the returner, \(afterReturn) of the pages are still resident")
    }
}
