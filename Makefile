# userstore — shortcuts over scripts/ (which are what the README and CI run).
SHELL := /bin/bash
export PATH := $(PATH):/opt/swift/usr/bin

.PHONY: deps build release test run clean

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

clean:
	rm -rf .build .run
