import Testing
import UserStoreCore
@testable import UserStoreConfiguration

/// `rollout.*`: a release's staging from the configuration, and clear errors naming the key.
struct RolloutConfigurationTests {
    private static let base = "appVersion: \"1.0.0\"\n"

    @Test func noRolloutSectionMeansReleasesAreNotStaged() async throws {
        #expect(try await ConfigurationKeyTests.load(Self.base).rollout == nil)
    }

    @Test func readsStepsAsAListOrAStringWithWaitHaltOnAndCanaries() async throws {
        let listed = try await ConfigurationKeyTests.load(Self.base + "rollout:\n  steps: [1%, 10%, 100%]\n  wait: 30m\n  haltOn: 0.5%\n  canary: [alice, bob]\n")
        #expect(listed.rollout == (try RolloutPolicy(steps: [1, 10, 100], canary: ["alice", "bob"], waitSeconds: 1800, haltOn: 0.005)))
        let text = try await ConfigurationKeyTests.load(Self.base + "rollout:\n  steps: \"50%,100%\"\n  wait: 90\n")
        #expect(text.rollout == (try RolloutPolicy(steps: [50, 100], waitSeconds: 90, haltOn: RolloutPolicy.defaultHaltOn)))
    }

    @Test(arguments: [
        ("rollout:\n  steps: [10%, 50%]\n", "rollout.steps", "the last step must be 100%"),
        ("rollout:\n  steps: [50%, 10%, 100%]\n", "rollout.steps", "must grow"),
        ("rollout:\n  wait: 10m\n", "rollout.steps", "is required when rollout.wait is set"),
        ("rollout:\n  steps: [100%]\n  wait: soon\n", "rollout.wait", "duration"),
        ("rollout:\n  steps: [100%]\n  haltOn: lots\n", "rollout.haltOn", "percentage"),
        ("rollout:\n  steps: [100%]\n  canary: [\"a/b\"]\n", "rollout.canary", "canary"),
    ])
    func aBadPolicyIsRefusedNamingItsKey(yaml: String, key: String, problem: String) async throws {
        do {
            _ = try await ConfigurationKeyTests.load(Self.base + yaml)
            Issue.record("accepted: \(yaml)")
        } catch let error as ConfigurationError {
            #expect(error.key == key && error.description.contains(problem), "\(error)")
        }
    }
}
