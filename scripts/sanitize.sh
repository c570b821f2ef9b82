#!/bin/bash
# Runs the whole test suite under a sanitizer, in its own build directory (not part of make test:
# a sanitized build takes minutes and the suite runs slower).
#   bash scripts/sanitize.sh address     # AddressSanitizer (+ LeakSanitizer at every exit)
#   bash scripts/sanitize.sh thread      # ThreadSanitizer
# Extra arguments go to swift test (e.g. --filter HardeningTests).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
sanitizer="${1:?usage: sanitize.sh address|thread [swift test arguments]}"
shift
bash scripts/install-deps.sh
scratch=".build-$sanitizer"
swift build --build-tests --scratch-path "$scratch" -Xswiftc -sanitize="$sanitizer"
# AddressSanitizer: halt_on_error makes the first report fail the process that made it (a
# daemon's exit status, a test's), so a finding cannot scroll by unnoticed.
# ThreadSanitizer: it cannot see Synchronization.Mutex on Linux (a Mutex-guarded counter is
# reported as a race), so every Mutex-guarded access is reported; it runs to the end and the
# reports are read (docs/reliability.md, Sanitizers).
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:suppressions=$PWD/Tests/sanitizers/asan.supp}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/Tests/sanitizers/lsan.supp}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0 report_signal_unsafe=0}"
swift test --skip-build --scratch-path "$scratch" "$@"
