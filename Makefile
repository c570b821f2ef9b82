# userstore — build, test, run. Every target installs what it needs first (Debian 12, root).
SHELL := /bin/bash
export PATH := $(PATH):/opt/swift/usr/bin
CONFIG ?= config/userstored.yaml

.PHONY: deps build release test run clean

deps:
	@scripts/install-deps.sh

build: deps
	swift build

release: deps
	swift build -c release

## Runs every test: unit and integration tests against real files, sockets and processes.
test: deps
	swift build --build-tests
	swift test

## Runs the daemon in the foreground on the repository's own default config.
run: deps
	swift build --product userstored
	.build/debug/userstored --config $(CONFIG)

clean:
	rm -rf .build
