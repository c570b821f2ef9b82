/// Which users this daemon may serve, when there is more than one host (`cluster.*`): the
/// registry asks before every lease, the event loops' fast path included, so a store whose
/// bucket moved away is refused from the next request on.
public protocol StorePlacement: Sendable {
    /// Throws ``StoreError/wrongHost(user:host:address:epoch:)`` when another host owns
    /// `user`'s bucket, ``StoreError/clusterUnavailable(user:message:)`` when this host cannot
    /// tell now. Called on every request: must not wait.
    func admit(_ user: UserID) throws(StoreError)
}
