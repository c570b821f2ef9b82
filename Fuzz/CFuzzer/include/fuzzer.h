#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver (LLVM 12+): runs `callback` on generated inputs, as libFuzzer's own main
/// would. SwiftPM links an executable's entry point as <target>_main, so each fuzzer calls this.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
