import Dispatch
import Foundation
import Synchronization
import Testing
@testable import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// ``EventLoop/atEndOfTurn(_:)``: the handlers that ask are told once every descriptor of the
/// turn has been handled (the connections send their replies there, so a turn's replies leave
/// together); one that asks again while told is told again before the loop waits; timers run
/// only once a turn has ended.
@Suite(.serialized)
final class EventLoopTurnTests {
    let loop: EventLoop
    /// What happened, in order: "ready N" and "end N" for handler N.
    let log = Log()

    final class Log: Sendable {
        private let entries = Mutex<[String]>([])
        func append(_ entry: String) { entries.withLock { $0.append(entry) } }
        var all: [String] { entries.withLock { $0 } }
    }

    init() throws {
        loop = try EventLoop(name: "turn-test")
        loop.start()
    }

    deinit {
        loop.stopAndWait()
    }

    /// Reads what its socket has; asks for the end of the turn (`asks` times in all, the
    /// later ones from ``turnEnded()``); signals `told` on each end of turn.
    final class Handler: EventHandler, TurnEndHandler, @unchecked Sendable { // used on the loop's thread only
        let name: String, descriptor: Int32, loop: EventLoop
        let log: Log
        let told = DispatchSemaphore(value: 0)
        var asks: Int
        /// Set, ``ready(_:)`` also sets a timer due at once, which logs "timer N" and signals it.
        var timerFired: DispatchSemaphore?
        var token: UInt64 = 0

        init(_ name: String, descriptor: Int32, loop: EventLoop, log: Log, asks: Int) {
            (self.name, self.descriptor, self.loop, self.log, self.asks) = (name, descriptor, loop, log, asks)
        }

        func ready(_ events: UInt32) {
            var byte: UInt8 = 0
            _ = read(descriptor, &byte, 1)
            log.append("ready \(name)")
            asks -= 1
            loop.atEndOfTurn(self)
            if let timerFired {
                loop.schedule(after: 0) { [log, name] in
                    log.append("timer \(name)")
                    timerFired.signal()
                }
            }
        }

        func turnEnded() {
            log.append("end \(name)")
            if asks > 0 {
                asks -= 1
                loop.atEndOfTurn(self)
            }
            told.signal()
        }
    }

    /// A connected pair of sockets: the handler's end and the writer's.
    func socketPair() throws -> (ours: Int32, theirs: Int32) {
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            throw TransportError.system("socketpair", errno)
        }
        return (pair[0], pair[1])
    }

    /// Registers a handler for each of `asks` on a socket of its own; runs `body` with them and
    /// the writers' ends, then unregisters and closes everything.
    func withHandlers(asks: [Int], _ body: ([Handler], [Int32]) throws -> Void) throws {
        let pairs = try asks.map { _ in try socketPair() }
        let handlers = zip(pairs, asks).enumerated().map { index, item in
            Handler("\(index)", descriptor: item.0.ours, loop: loop, log: log, asks: item.1)
        }
        let registered = DispatchSemaphore(value: 0)
        loop.execute { [handlers] in
            for handler in handlers { handler.token = try! handler.loop.register(handler.descriptor, events: 0x001 /* EPOLLIN */, handler) }
            registered.signal()
        }
        registered.wait()
        defer {
            let removed = DispatchSemaphore(value: 0)
            loop.execute { [handlers] in
                for handler in handlers { handler.loop.unregister(handler.descriptor, token: handler.token) }
                removed.signal()
            }
            removed.wait()
            for pair in pairs { close(pair.ours); close(pair.theirs) }
        }
        try body(handlers, pairs.map(\.theirs))
    }

    @Test func handlersAreToldAfterEveryDescriptorOfTheTurn() throws {
        try withHandlers(asks: [1, 1, 1]) { handlers, writers in
            // Written from a task on the loop: all three are ready when it next waits, so one
            // turn handles them.
            loop.execute {
                var byte: UInt8 = 1
                for writer in writers { _ = write(writer, &byte, 1) }
            }
            for handler in handlers { #expect(handler.told.wait(timeout: .now() + 10) == .success) }
            let log = self.log.all
            #expect(log.count == 6, "\(log)")
            #expect(log.prefix(3).allSatisfy { $0.hasPrefix("ready") }, "\(log)")
            #expect(Set(log.suffix(3)) == ["end 0", "end 1", "end 2"], "\(log)")
        }
    }

    /// A timer (the connections' idle sweep) never sees what a turn left for its end: one due
    /// while a turn runs waits for that turn to end.
    @Test func aTimerDueDuringATurnRunsAfterTheTurnHasEnded() throws {
        try withHandlers(asks: [1]) { handlers, writers in
            let fired = DispatchSemaphore(value: 0)
            handlers[0].timerFired = fired
            var byte: UInt8 = 1
            _ = write(writers[0], &byte, 1)
            #expect(fired.wait(timeout: .now() + 10) == .success)
            #expect(log.all == ["ready 0", "end 0", "timer 0"])
        }
    }

    @Test func aHandlerThatAsksAgainWhileToldIsToldAgain() throws {
        try withHandlers(asks: [3]) { handlers, writers in
            var byte: UInt8 = 1
            _ = write(writers[0], &byte, 1)
            for _ in 0..<3 { #expect(handlers[0].told.wait(timeout: .now() + 10) == .success) }
            #expect(log.all == ["ready 0", "end 0", "end 0", "end 0"])
        }
    }
}
