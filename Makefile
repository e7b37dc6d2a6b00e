# Two commands on a fresh machine: `make demo` and `make test`. Each makes .venv itself.
# `make` alone lists the targets (a `## ` comment after a target is its line in the list).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One virtual environment, installed in two steps, each with its own stamp: the runtime
# dependencies (all `make demo` needs), then the test extra on top (ruff, mypy, pytest,
# nnrp-py, the deployment checkers). `make test` after `make demo` adds only the extra;
# `make demo` after `make test` installs nothing. Editing pyproject.toml redoes both.
RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP := $(VENV)/.installed-test

.DEFAULT_GOAL := help
.PHONY: help demo otel test check lint typecheck unit conformance bench bench-smoke fuzz fuzz-native flake-check compiled compiled-check clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  make %-12s %s\n", $$1, $$2}' \
	  $(MAKEFILE_LIST)

# The installer is uv, put into the venv from PyPI by the host's pip: it resolves and
# downloads in parallel (the runtime set in 2.6 s on the 2-core VM, against 11 s for pip
# and 4 s more to give the venv a new pip first), so `make demo` takes about half the time.
# A host whose pip cannot install into another interpreter (none, or older than 22.3), or
# a platform uv has no wheel for, gets ensurepip's pip instead; `install` uses what is
# there. The venv is made without ensurepip's bundled pip (unpacking it took 8 s).
# Byte-compiling is skipped (uv's default; pip's --no-compile): the demo compiles only
# what it imports.
define install
	if [ -x $(BIN)/uv ]; then $(BIN)/uv pip install --quiet --python $(BIN)/python $(1); \
	else $(BIN)/python -m pip install --quiet --no-compile $(1); fi
endef

$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	test -x $(BIN)/uv || $(PYTHON) -m pip --python $(BIN)/python install --quiet uv \
	  || $(BIN)/python -m pip --version > /dev/null 2>&1 \
	  || $(BIN)/python -m ensurepip --upgrade > /dev/null
	$(call install,-e .)
	touch $@

# The tests start a few hundred gateway and CLI processes. Where PYTHONDONTWRITEBYTECODE is
# set (it is on these machines), each would compile every module it imports from source:
# `import gateway.app, cli.main` took 2.5 s of CPU uncompiled against 1.1 s compiled. So the
# test venv is compiled once here (an optimisation: a package file that does not compile
# fails nothing), and the project's own code before each `make unit`.
$(TEST_STAMP): $(RUNTIME_STAMP)
	$(call install,-e '.[test]')
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null \
	  || echo "compileall: a package file did not compile (it is compiled when imported)"
	touch $@

demo: $(RUNTIME_STAMP) ## the gateway and a replay vLLM; one chat answer streamed over NNRP
	$(BIN)/nnrp-gateway demo

# The otel extra for `serve --otel-traces` (docs/observability.md, "Traces"); the test extra has it too.
otel: $(RUNTIME_STAMP) ## OpenTelemetry's SDK and OTLP exporter into .venv, for --otel-traces
	$(call install,-e '.[otel]')

test: lint typecheck unit conformance bench-smoke compiled-check ## everything CI runs: lint, typecheck, unit, conformance, bench-smoke, compiled-check

# The quick tier, while working: lint, types, and the tests that open no socket and start
# no process (the sans-IO layers, the profile, the pipeline's stages, the upstream's
# parsers, the server's units, the transport's URIs and QUIC endpoint), the property
# tests at a tenth of their examples (tests/support/tiers.py). About a minute on the
# 2-core VM; `make test` runs it all.
CHECK_TESTS := tests/nnrp tests/profile tests/pipeline tests/test_errors.py \
  tests/test_layers.py tests/test_exports.py tests/upstream/test_sse.py \
  tests/upstream/test_http1.py tests/upstream/test_http1_differential.py \
  tests/upstream/test_chunk_fast_path.py tests/upstream/test_slots.py \
  tests/upstream/test_versions_errors.py tests/server/test_outbox.py \
  tests/server/test_operation.py tests/server/test_session.py \
  tests/server/test_outbox_fuzz.py tests/transport/test_endpoints.py \
  tests/transport/test_quic_endpoint.py
check: lint typecheck ## the quick tier: lint, types, the sans-IO and unit tests (a minute)
	NNRP_TESTS_TIER=check $(BIN)/pytest -q -p no:cacheprovider $(CHECK_TESTS)

lint: $(TEST_STAMP) ## ruff on gateway, cli and tests
	$(BIN)/ruff check gateway cli tests

typecheck: $(TEST_STAMP) ## mypy --strict on gateway and cli
	$(BIN)/mypy --strict gateway cli

unit: $(TEST_STAMP) $(BIN)/promtool $(BIN)/haproxy ## the whole pytest suite
	$(BIN)/python -m compileall -q -j 0 gateway cli tests > /dev/null
	$(BIN)/pytest -q

# Prometheus' promtool, for the alert rules' unit tests and the /metrics lint
# (tests/deploy/test_observability.py): the binary alone, unpacked from Debian's
# `prometheus` package into the venv (8 s here; it needs only libc), so no Prometheus
# service is set up and nothing lands outside .venv. apt's lists are fetched first only
# when there are none and we are root; as root, a download that fails (stale lists name
# a version the mirror no longer has: 404) fetches the lists and tries once more. Where
# this cannot work (no apt, no lists), the tests that need promtool skip and say why,
# except where NNRP_REQUIRE_PROMTOOL=1 (CI: .ci/run) makes them fail; one on the PATH is
# used as it is.
$(BIN)/promtool: | $(RUNTIME_STAMP)
	@if command -v promtool > /dev/null; then echo "promtool: $$(command -v promtool)"; \
	elif command -v apt-get > /dev/null && command -v dpkg-deb > /dev/null; then \
	  dir=$$(mktemp -d) && chmod a+rwx $$dir && \
	  { ls /var/lib/apt/lists/*_Packages* > /dev/null 2>&1 || [ "$$(id -u)" != 0 ] \
	    || apt-get update -qq; } && \
	  { (cd $$dir && apt-get download -qq prometheus) \
	    || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	         && (cd $$dir && apt-get download -qq prometheus); }; } && \
	  dpkg-deb -x $$dir/prometheus_*.deb $$dir/root && \
	  cp $$dir/root/usr/bin/promtool $@; rm -rf $$dir; \
	fi; test -x $@ || command -v promtool > /dev/null \
	  || echo "promtool unavailable: the tests that need it will skip"

# Debian's HAProxy, the load balancer in front of the fleet tests (tests/e2e/test_fleet.py):
# unpacked from Debian's packages into .venv/opt/haproxy with the three libraries it
# loads that a bare machine lacks (Lua 5.3, OpenTracing), run by a small wrapper that
# points the loader there; no service is set up and nothing lands outside .venv. apt's
# lists as for promtool. Where it cannot be had, those tests skip and say why, except
# where NNRP_REQUIRE_HAPROXY=1 (CI) makes them fail; one on the PATH is used as it is.
HAPROXY_DEBS := haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1
$(BIN)/haproxy: | $(RUNTIME_STAMP)
	@if command -v haproxy > /dev/null; then echo "haproxy: $$(command -v haproxy)"; \
	elif command -v apt-get > /dev/null && command -v dpkg-deb > /dev/null; then \
	  dir=$$(mktemp -d) && chmod a+rwx $$dir && \
	  { ls /var/lib/apt/lists/*_Packages* > /dev/null 2>&1 || [ "$$(id -u)" != 0 ] \
	    || apt-get update -qq; } && \
	  { (cd $$dir && apt-get download -qq $(HAPROXY_DEBS) 2> /dev/null) \
	    || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	         && (cd $$dir && apt-get download -qq $(HAPROXY_DEBS) 2> /dev/null); }; } && \
	  rm -rf $(VENV)/opt/haproxy && mkdir -p $(VENV)/opt/haproxy && \
	  for deb in $$dir/*.deb; do dpkg-deb -x $$deb $(VENV)/opt/haproxy || exit 1; done && \
	  printf '#!/bin/sh\nhere=$$(cd "$$(dirname "$$0")/../opt/haproxy" && pwd)\nLD_LIBRARY_PATH="$$here/usr/lib/x86_64-linux-gnu:$$here/usr/lib/aarch64-linux-gnu$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" exec "$$here/usr/sbin/haproxy" "$$@"\n' > $@ && \
	  chmod +x $@ && $@ -v > /dev/null || rm -f $@; rm -rf $$dir; \
	fi; test -x $@ || command -v haproxy > /dev/null \
	  || echo "haproxy unavailable: the fleet tests behind a load balancer will skip"

conformance: $(TEST_STAMP) ## the suite's and the project's recipes on every transport, both clients
	BIN=$(BIN) bash .ci/conformance

# Proves the benchmark commands work; the figures are not checked (never timed in CI).
bench-smoke: $(TEST_STAMP) ## bench codec, wire and run in --quick form, and two short soaks
	$(BIN)/nnrp-gateway bench codec --quick > /dev/null
	$(BIN)/nnrp-gateway bench wire --quick > /dev/null
	$(BIN)/nnrp-gateway bench run --quick --out out/bench-quick > /dev/null
	@echo "bench --quick: ok (out/bench-quick/summary.md)"
	$(BIN)/nnrp-gateway bench soak --streams 200 --seconds 30 --out out/soak
	$(BIN)/nnrp-gateway bench soak --streams 100 --seconds 15 --sigterm-at 8 --out out/soak-sigterm

bench: $(TEST_STAMP) ## the full benchmarks (minutes; figures in docs/benchmarks.md)
	$(BIN)/nnrp-gateway bench codec
	$(BIN)/nnrp-gateway bench wire
	$(BIN)/nnrp-gateway bench run --out out/bench

# The e2e and interop tiers again and again, quiet and beside a CPU hog: a test that
# races a stream against a client action fails here (issue 28). Not part of `make test`.
flake-check: $(TEST_STAMP) ## the e2e and interop tiers repeated, quiet and loaded (TESTS picks some)
	BIN=$(BIN) bash .ci/flake-check $(TESTS)

# Coverage-guided fuzzing (atheris) of the untrusted-input parsers, the server's state
# machine (every preview4 control) and the QUIC endpoint, FUZZ_SECONDS each; FUZZ_TARGETS
# picks some.
# New inputs go to out/fuzz/<target>, crash inputs to out/fuzz/crash-*, logs to
# out/fuzz/<target>.log; the seed corpus in tests/fuzz/corpus stays clean.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= nnrp_decoder typed_body envelope sse controls server_session quic_datagram http1 resume
fuzz: $(TEST_STAMP) ## atheris on the untrusted-input parsers, FUZZ_SECONDS each
	$(call install,atheris)
	for target in $(FUZZ_TARGETS); do \
	  mkdir -p out/fuzz/$$target; \
	  $(BIN)/python tests/fuzz/fuzz_targets.py $$target out/fuzz/$$target \
	    tests/fuzz/corpus/$$target -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=out/fuzz/ > out/fuzz/$$target.log 2>&1; status=$$?; \
	  tail -12 out/fuzz/$$target.log; \
	  if [ $$status -ne 0 ]; then echo "fuzz $$target found a crash: see out/fuzz/"; exit 1; fi; \
	done

# The C plain text delta against the pure one (the fuzz target plain_blocks), on the
# compiled build, which has it: `make compiled` first. FUZZ_SECONDS, as above.
fuzz-native: ## atheris: the C plain text delta against the pure one, on .venv-compiled
	@test -x $(COMPILED_VENV)/bin/python || { echo "fuzz-native: make compiled first"; exit 1; }
	$(BIN)/uv pip install --quiet --python $(COMPILED_VENV)/bin/python atheris
	mkdir -p out/fuzz/plain_blocks
	$(COMPILED_VENV)/bin/python tests/fuzz/fuzz_targets.py plain_blocks out/fuzz/plain_blocks \
	  tests/fuzz/corpus/plain_blocks -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -artifact_prefix=out/fuzz/ > out/fuzz/plain_blocks.log 2>&1; status=$$?; \
	  tail -12 out/fuzz/plain_blocks.log; \
	  if [ $$status -ne 0 ]; then echo "fuzz plain_blocks found a difference: see out/fuzz/"; exit 1; fi

# The compiled build (gateway/compiled.py; off by default): the wheel built with
# NNRP_GATEWAY_COMPILE=1 (mypyc and gcc, hatch_build.py; out/compiled/), installed with the
# test extra into .venv-compiled, then COMPILED_TESTS on it: the static checks, the unit
# tier and the e2e tier. pytest imports the installed gateway, not this checkout's
# (--import-mode=append), and NNRP_TESTS_COMPILED=1 makes tests/test_compiled.py fail
# unless the per-event modules ran compiled. HAProxy and promtool are .venv's: the fleet
# and alert-rule tests skip here. Needs uv (`make test` puts it into .venv).
COMPILED_VENV := .venv-compiled
COMPILED_TESTS ?= tests/test_compiled.py $(CHECK_TESTS) tests/e2e
COMPILED_TIER ?=
compiled: $(TEST_STAMP) ## the compiled build in .venv-compiled, and the unit and e2e tiers on it
	rm -rf out/compiled
	NNRP_GATEWAY_COMPILE=1 $(BIN)/uv build --quiet --wheel --out-dir out/compiled .
	test -x $(COMPILED_VENV)/bin/python || $(BIN)/uv venv --quiet --python $(BIN)/python \
	  $(COMPILED_VENV)
	$(BIN)/uv pip install --quiet --python $(COMPILED_VENV)/bin/python --reinstall-package \
	  nnrp-vllm-gateway "$$(ls out/compiled/*.whl)[test]"
	$(COMPILED_VENV)/bin/nnrp-gateway --version
	NNRP_TESTS_COMPILED=1 NNRP_TESTS_TIER=$(COMPILED_TIER) NNRP_REQUIRE_HAPROXY= \
	  NNRP_REQUIRE_PROMTOOL= $(COMPILED_VENV)/bin/pytest -q -p no:cacheprovider \
	  --import-mode=append $(COMPILED_TESTS)

# `make test`'s compiled leg, bounded (3.5 minutes on the 2-core VM, most of it the
# build): the static checks, the unit tier at a tenth of its property examples, and the
# e2e tests that compare every recorded transcript at the client; the whole e2e tier on
# the compiled build is `make compiled` (another 4 minutes).
compiled-check: COMPILED_TESTS = tests/test_compiled.py $(CHECK_TESTS) \
  tests/e2e/test_fidelity.py tests/e2e/test_recorded_032.py tests/e2e/test_pipeline.py
compiled-check: COMPILED_TIER = check
compiled-check: compiled ## make test's compiled leg: the build, the unit tier, the recorded-transcript e2e tests

clean: ## remove .venv, .venv-compiled and the tools' caches
	rm -rf $(VENV) $(COMPILED_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
