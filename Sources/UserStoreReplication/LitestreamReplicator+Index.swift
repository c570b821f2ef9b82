import ServiceLifecycle

/// The index of the users a bucket holds (``ReplicaIndex``): loaded once at start.
extension LitestreamReplicator {
    /// Lists which users the bucket holds (one host, `s3://`), trying again every 5 s until the
    /// bucket answers; until then every new user asks the bucket itself.
    package func loadReplicaIndex() async {
        guard fencing == nil else { return }
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                let started = ContinuousClock.now
                guard let users = try await storage.listUsers() else { return }
                replicaIndex.loaded(users)
                logger.info("replica index: \(users.count) users in the bucket, listed in \(ContinuousClock.now - started)")
                return
            } catch {
                logger.warning("replica index: listing the bucket failed (\(error)); new users ask the bucket until it answers")
                try? await Task.sleep(for: .seconds(5))
            }
        }
    }
}
