import DaemonTestSupport
import Foundation
import Testing

/// The units as shipped: static checks here, and the real unit under a real PID 1 systemd in
/// systemd-nspawn (Tests/systemd/nspawn-test.sh, which installs with `make install` into a
/// staging folder and boots the host's own /usr).
@Suite(.serialized) struct SystemdUnitTests {
    @Test func theServiceIsHardenedToAnExposureOfAtMostTwo() throws {
        let result = try run(["/usr/bin/systemd-analyze", "security", "--offline=yes", "--no-pager", repositoryRoot + "/systemd/userstored.service"])
        let line = try #require(result.stdout.split(separator: "\n").last { $0.contains("Overall exposure level") })
        let exposure = try #require(Double(line.split(separator: ":").last!.split(separator: " ").first!))
        #expect(exposure <= 2.0, "\(line)")
    }

    @Test func theSocketUnitVerifiesClean() throws {
        let result = try run(["/usr/bin/systemd-analyze", "verify", "--man=no", repositoryRoot + "/systemd/userstored.socket"])
        #expect(result.status == 0 && result.stdout.isEmpty && result.stderr.isEmpty, "\(result.stdout)\(result.stderr)")
    }

    @Test(.timeLimit(.minutes(10)))
    func theRealUnitWorksUnderARealSystemd() throws {
        let work = try TemporaryDirectory()
        let result = try run(["/bin/bash", repositoryRoot + "/Tests/systemd/nspawn-test.sh", work.path], environment: ["BIN_DIR": productsDirectory])
        let failures = result.stdout.split(separator: "\n").filter { $0.hasPrefix("FAIL") }
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(failures.isEmpty, "\(failures)")
        #expect(result.stdout.split(separator: "\n").filter { $0.hasPrefix("ok: ") }.count >= 25, "\(result.stdout)")
        print(result.stdout)
    }
}
