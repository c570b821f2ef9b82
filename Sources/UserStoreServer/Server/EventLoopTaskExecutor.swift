import NIOCore

/// Runs a connection's Swift task on its channel's own event loop thread, so reading a
/// request, answering it and writing the reply involve no hand-off between threads; only the
/// SQL itself goes to the store's serial queue (and a slow statement therefore never blocks an
/// event loop). Everything that runs here must be non-blocking.
final class EventLoopTaskExecutor: TaskExecutor {
    let eventLoop: any EventLoop

    init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        eventLoop.execute { job.runSynchronously(on: executor) }
    }
}
