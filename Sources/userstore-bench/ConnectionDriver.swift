import Foundation

/// Drives `connections` varlink connections from `threads` threads the way pgbench drives
/// PostgreSQL (`-c connections -j threads`): each thread multiplexes its share of the
/// connections with poll(2), and every connection sends its next request as soon as the reply to
/// the previous one arrives. Latency is measured per request, send to reply.
///
/// A thread per connection would spend the shared cores on the client's own context switches
/// and make the server look slower than it is; pgbench does not pay that price either.
func runConnections(_ connections: Int, threads: Int = 2, seconds: Double, socket: String,
                    request: @escaping @Sendable (Int) -> (() -> [UInt8])) -> (throughput: Double, latencies: Latencies, errors: Int) {
    let threadCount = max(1, min(threads, connections))
    return runWorkers(threadCount, seconds: seconds) { thread, waitForStart in
        let mine = Array(stride(from: thread, to: connections, by: threadCount))
        let clients = mine.map { _ in SocketClient(path: socket) }
        let makers = mine.map { request($0) }
        var polled = clients.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
        var sentAt = [UInt64](repeating: 0, count: clients.count)
        var samples: [UInt64] = []
        samples.reserveCapacity(400_000)
        var errors = 0, inFlight = 0
        let end = waitForStart()
        for slot in clients.indices {
            sentAt[slot] = nanoseconds()
            if clients[slot].send(makers[slot]()) { inFlight += 1 } else { errors += 1 }
        }
        while inFlight > 0 {
            let ready = poll(&polled, nfds_t(polled.count), 1000)
            guard ready > 0 else { if ready < 0 && errno == EINTR { continue } else { break } }
            for slot in polled.indices where polled[slot].revents != 0 {
                polled[slot].revents = 0
                let replies = clients[slot].receiveReplies()
                guard replies.count > 0 || !clients[slot].closed else { polled[slot].fd = -1; inFlight -= 1; errors += 1; continue }
                for ok in replies {
                    let now = nanoseconds()
                    samples.append(now - sentAt[slot])
                    if !ok { errors += 1 }
                    if now < end {
                        sentAt[slot] = now
                        if !clients[slot].send(makers[slot]()) { inFlight -= 1; errors += 1 }
                    } else {
                        inFlight -= 1
                    }
                }
            }
        }
        return (samples, errors)
    }
}
