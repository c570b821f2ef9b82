// The libFuzzer executable (scripts/fuzz.sh builds it with -sanitize=fuzzer and runs it once
// per target): USERSTORE_FUZZ_TARGET names the function it feeds (ServerFuzzing.targets).
import CFuzzer
import Glibc
import UserStoreFuzzTargets

/// The chosen target's function; set once in main, before libFuzzer calls back.
nonisolated(unsafe) private var body: (@Sendable (UnsafeBufferPointer<UInt8>) -> Void)?

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    body?(UnsafeBufferPointer(start: data, count: size))
    return 0
}

/// SwiftPM names an executable's entry point <target>_main; it hands over to libFuzzer's driver.
@_cdecl("fuzz_main")
func fuzzerMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> Int32 {
    let name = getenv("USERSTORE_FUZZ_TARGET").map { String(cString: $0) } ?? ""
    guard let chosen = ServerFuzzing.targets[name] else {
        let message = "fuzz: set USERSTORE_FUZZ_TARGET to one of \(ServerFuzzing.targets.keys.sorted().joined(separator: ", "))\n"
        _ = message.withCString { write(STDERR_FILENO, $0, strlen($0)) }
        return 2
    }
    body = chosen
    var count = argc
    var arguments: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = argv
    return LLVMFuzzerRunDriver(&count, &arguments) { data, size in fuzzOne(data, size) }
}
