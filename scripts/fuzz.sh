#!/bin/bash
# Fuzzes the parsers with libFuzzer (and AddressSanitizer): the JSON scanner, the NUL framing,
# call decoding, migration files and SQL text. Builds in .build-fuzz (USERSTORE_FUZZ=1 adds the
# fuzz executable to Package.swift; USERSTORE_FUZZ_TARGET picks the target), starts from the
# seed corpora in Fuzz/corpus (and, for migration files, config/migrations), and keeps what
# each run finds in .build-fuzz/corpus. A crash leaves its input in .build-fuzz/crashes and the
# script fails naming it.
#
#   bash scripts/fuzz.sh                 # ~30 s per target (what make test runs)
#   bash scripts/fuzz.sh --seconds 3600 json call   # a long run of some targets
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
seconds=30
targets=()
while (($#)); do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
((${#targets[@]})) || targets=(json framing call migration sql)

bash scripts/install-deps.sh
export USERSTORE_FUZZ=1
flags=(--scratch-path .build-fuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -use-ld=lld)
mkdir -p .build-fuzz
if ! swift build "${flags[@]}" --product fuzz >.build-fuzz/build.log 2>&1; then
    grep -E "error" .build-fuzz/build.log >&2 || tail -20 .build-fuzz/build.log >&2
    echo "fuzz: building the fuzzer failed (.build-fuzz/build.log)" >&2
    exit 1
fi
bin="$(swift build "${flags[@]}" --show-bin-path)"
mkdir -p .build-fuzz/crashes
status=0
for target in "${targets[@]}"; do
    work=".build-fuzz/corpus/$target"
    mkdir -p "$work"
    log=".build-fuzz/fuzz-$target.log"
    seeds=("Fuzz/corpus/$target")
    [[ $target == migration ]] && seeds+=(config/migrations) # the example's files are seeds too
    if USERSTORE_FUZZ_TARGET="$target" "$bin/fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix=".build-fuzz/crashes/$target-" "$work" "${seeds[@]}" >"$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
        echo "fuzz $target: $runs inputs in ${seconds}s, no crash (corpus $(ls "$work" | wc -l) files)"
    else
        echo "fuzz $target: FAILED — see $log and .build-fuzz/crashes/$target-*" >&2
        tail -30 "$log" >&2
        status=1
    fi
done
exit $status
