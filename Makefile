# The two commands the README promises:
#   make demo   set up and run the main job
#   make test   set up and run every test (what .ci/run calls)

CARGO ?= cargo
PY := .venv/bin/python

.PHONY: test demo setup lint unit fuzz-replay e2e bench build

setup:
	./scripts/setup.sh

build: setup
	$(CARGO) build --release -p espgate

lint: setup
	$(CARGO) fmt --all -- --check
	cd fuzz && $(CARGO) fmt -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --quiet

unit: setup
	$(CARGO) test --workspace

# Every saved fuzz input (corpora and regression reproducers) once through
# its target's oracles, on the stable toolchain (fuzz/replay.sh).
fuzz-replay: setup
	./fuzz/replay.sh

e2e: build
	ESPGATE=$(CURDIR)/target/release/espgate $(PY) -m pytest tests/python -q

test: lint unit fuzz-replay e2e

demo: build
	./scripts/demo.sh

bench: setup
	$(CARGO) bench -p espgate-core --bench esp
