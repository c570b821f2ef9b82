// Declarations only (fuzzer.h); libFuzzer provides the code.
