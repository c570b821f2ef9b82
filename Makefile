# userstore — shortcuts over scripts/ (which are what the README and CI run).
SHELL := /bin/bash
export PATH := $(PATH):/opt/swift/usr/bin

PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: deb package-test manpages deps build release test run install uninstall bench ab-point ab-release stop-time soak churn fuzz asan tsan clean cluster-test fuzz-smoke crash-s3

deps:
	@bash scripts/install-deps.sh

build: deps
	swift build

release: deps
	swift build -c release

## Every test.
test:
	bash scripts/test.sh

## The daemon in the foreground on config/userstored.yaml.
run:
	bash scripts/run.sh

## Binaries, units, config, migrations, catalog, completions (PREFIX, DESTDIR).
install:
	PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) bash scripts/install.sh install

uninstall:
	PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) bash scripts/install.sh uninstall

## The Debian package: .build/deb/userstore_<version>-<revision>_amd64.deb (+ -dbgsym), lintian's
## report in .build/deb/lintian.txt (debian/, docs/package.md). DEB_REVISION=N (default 1).
deb:
	bash scripts/deb.sh

## The package in a fresh Debian 12 under systemd: install, upgrade, remove, purge (~10 min).
package-test:
	bash Tests/package/package-test.sh

## The man pages alone, into .build/man (the package builds them too).
manpages: release
	bash scripts/manpages.sh "$$(swift build -c release --show-bin-path)" .build/man

## Benchmarks against PostgreSQL, in-process SQLite and a sqlite3 loop (release build; not part of test).
bench:
	bash scripts/bench.sh

## Point queries on two daemons, alternating: the userstored of OLD (a git revision, built in a
## worktree under .build/ab) against the current tree's, on the same data (scripts/ab-point.sh).
ab-point:
	@test -n "$(OLD)" || { echo "usage: make ab-point OLD=<git revision>"; exit 2; }
	swift build -c release --static-swift-stdlib --product userstored
	rm -rf .build/ab/$(OLD) && git worktree add -f .build/ab/$(OLD) $(OLD)
	cd .build/ab/$(OLD) && swift build -c release --static-swift-stdlib --product userstored
	bash scripts/ab-point.sh .build/ab/$(OLD)/.build/release/userstored "$$(swift build -c release --show-bin-path)/userstored"

## The cost of a staged release on the request path: the same userstored with no release, and
## with a staged release in force (a migration loaded, step 50%: half the stores held back at
## their version), alternating, on the same data (scripts/ab-point.sh; docs/performance.md).
ab-release:
	swift build -c release --static-swift-stdlib --product userstored
	NEW_MIGRATION="CREATE TABLE release_marker (x INTEGER);" \
	NEW_CONFIG="$$(printf 'rollout:\n  steps: [50%%, 100%%]\n  wait: 1d\n')" \
	bash scripts/ab-point.sh "$$(swift build -c release --show-bin-path)/userstored" "$$(swift build -c release --show-bin-path)/userstored"

## How long a stop takes with 1,000 stores open, replicated on a folder: the userstored of OLD
## (a git revision, built in a worktree under .build/ab) against the tree's, alternating
## (scripts/stop-time.py; docs/performance.md, "Stopping").
stop-time:
	@test -n "$(OLD)" || { echo "usage: make stop-time OLD=<git revision>"; exit 2; }
	swift build -c release --product userstored
	rm -rf .build/ab/$(OLD) && git worktree add -f .build/ab/$(OLD) $(OLD)
	cd .build/ab/$(OLD) && swift build -c release --product userstored
	python3 scripts/stop-time.py --replica .build/ab/$(OLD)/.build/release/userstored "$$(swift build -c release --show-bin-path)/userstored"
	python3 scripts/stop-time.py .build/ab/$(OLD)/.build/release/userstored "$$(swift build -c release --show-bin-path)/userstored"

## The cluster harness, full length (scripts/test.sh runs a short one): 3 etcd members, 3
## daemons on 127.0.0.2-4, ~300 users, six faults, the history checker (docs/cluster.md).
cluster-test: build
	python3 scripts/cluster-test.py --users 300 --seconds 15 --json .build/cluster-test.json

## 10 minutes of mixed load at half of capacity: RSS, fds and p99 over time (not part of test).
soak:
	bash scripts/soak.sh

## 100,000 users through maxOpenStores 1,024 replicating to S3 (SeaweedFS), then the disk lost
## and 1,000 of them restored: RSS, fds, S3 requests and bytes over time (not part of test).
churn:
	bash scripts/churn.sh --no-replication --json .build/churn-off.json
	bash scripts/churn.sh --json .build/churn.json

## The parsers' fuzzers for an hour each.
fuzz:
	bash scripts/fuzz.sh --seconds 3600

## libFuzzer, 15 s per target (builds the fuzzer first: ~9 minutes from scratch here).
fuzz-smoke:
	bash scripts/fuzz.sh --seconds 15

## The whole suite under AddressSanitizer / ThreadSanitizer (own build directories).
asan:
	bash scripts/sanitize.sh address

tsan:
	bash scripts/sanitize.sh thread

clean:
	rm -rf .build .run

# 1,000 SIGKILLs of the daemon under durable writes to the daemon's own log on S3 (SeaweedFS on
# its own port), then the disk lost: every durably acknowledged write must come back.
crash-s3:
	bash scripts/crash-s3.sh
