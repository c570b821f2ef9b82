import Foundation

extension LogUploader {
    /// Waits on this thread until record `number` — and with it every earlier record of its
    /// store — is stored; false when `deadline` came first. For a job in a store's turn (the
    /// checkpoint of ``LoggedStore``), which must not give the turn back while it waits: a wait
    /// for the uploader's progress itself, with no task started and no thread of another pool
    /// taken for it.
    func waitOnThisThread(for number: UInt64, until deadline: ContinuousClock.Instant) -> Bool {
        storedSignal.lock()
        defer { storedSignal.unlock() }
        // Checked under the signal's lock, which the uploader takes after it marks records
        // stored: a store between the look and the wait still wakes it.
        while !isStored(number) {
            let left = deadline - .now
            guard left > .zero else { return false }
            _ = storedSignal.wait(until: Date(timeIntervalSinceNow: left.inSeconds))
        }
        return true
    }

    /// Wakes the threads in ``waitOnThisThread(for:until:)``: records were stored.
    func signalStored() {
        storedSignal.lock()
        storedSignal.broadcast()
        storedSignal.unlock()
    }
}
