// libFuzzer fuzzer (scripts/fuzz.sh builds it with -sanitize=fuzzer): ServerFuzzing.call.
import CFuzzer
import UserStoreServer

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    ServerFuzzing.call(UnsafeBufferPointer(start: data, count: size))
    return 0
}

/// SwiftPM names an executable's entry point <target>_main; it hands over to libFuzzer's driver.
@_cdecl("fuzz_call_main")
func fuzzerMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> Int32 {
    var count = argc
    var arguments: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = argv
    return LLVMFuzzerRunDriver(&count, &arguments) { data, size in fuzzOne(data, size) }
}
