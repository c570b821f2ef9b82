// libFuzzer fuzzer (scripts/fuzz.sh builds it with -sanitize=fuzzer): VarlinkFuzzing.json.
import CFuzzer
import Varlink

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    VarlinkFuzzing.json(UnsafeBufferPointer(start: data, count: size))
    return 0
}

/// SwiftPM names an executable's entry point <target>_main; it hands over to libFuzzer's driver.
@_cdecl("fuzz_json_main")
func fuzzerMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> Int32 {
    var count = argc
    var arguments: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = argv
    return LLVMFuzzerRunDriver(&count, &arguments) { data, size in fuzzOne(data, size) }
}
