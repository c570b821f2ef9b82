import Foundation

/// SplitMix64: a fast, seedable generator for picking users and ids.
struct FastRandom {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
}

/// Runs `threads` workers for `seconds`; each calls `work` in a loop and records its latency.
func runLoad(threads: Int, seconds: Double, setup: @escaping @Sendable (Int) -> (@Sendable () -> Bool)) -> (throughput: Double, latencies: Latencies, errors: Int) {
    runWorkers(threads, seconds: seconds) { index, waitForStart in
        let work = setup(index)
        var samples: [UInt64] = []
        samples.reserveCapacity(200_000)
        var errors = 0
        let deadline = waitForStart()
        while true {
            let before = nanoseconds()
            if before >= deadline { break }
            if !work() { errors += 1 }
            samples.append(nanoseconds() - before)
        }
        return (samples, errors)
    }
}

/// Starts `threads` threads running `worker` together: each sets itself up, then calls the
/// `waitForStart` it is given, which returns when every thread is ready with the common
/// deadline (nanoseconds). Each returns its latency samples and error count.
func runWorkers(_ threads: Int, seconds: Double,
                _ worker: @escaping @Sendable (_ index: Int, _ waitForStart: () -> UInt64) -> (samples: [UInt64], errors: Int))
    -> (throughput: Double, latencies: Latencies, errors: Int) {
    final class Shared: @unchecked Sendable { // each worker writes its own slot; the deadline is set before the start signal
        var samples: [[UInt64]]
        var errors: [Int]
        var deadline: UInt64 = 0
        init(_ count: Int) { samples = Array(repeating: [], count: count); errors = Array(repeating: 0, count: count) }
    }
    let shared = Shared(threads)
    let group = DispatchGroup()
    let start = DispatchSemaphore(value: 0)
    for index in 0..<threads {
        group.enter()
        Thread {
            let (samples, errors) = worker(index) {
                start.wait()
                return shared.deadline
            }
            shared.samples[index] = samples
            shared.errors[index] = errors
            group.leave()
        }.start()
    }
    usleep(200_000) // let every worker connect before the clock starts
    let begin = nanoseconds()
    shared.deadline = begin + UInt64(seconds * 1e9)
    for _ in 0..<threads { start.signal() }
    group.wait()
    let elapsed = Double(nanoseconds() - begin) / 1e9
    let all = shared.samples.flatMap { $0 }
    return (Double(all.count) / elapsed, Latencies(samples: all), shared.errors.reduce(0, +))
}
