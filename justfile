# loomem tasks. Cargo's target directory lives outside the checkout so that
# fresh clones (CI) build incrementally.

set shell := ["bash", "-euo", "pipefail", "-c"]

export CARGO_TARGET_DIR := env_var_or_default("CARGO_TARGET_DIR", env_var("HOME") / ".cache/loomem/target")

# List the recipes.
default:
    @just --list

# Install what a bare Debian machine lacks (protoc, nats-server, just).
setup:
    bash scripts/setup.sh

# Set up, start a local nats-server -js if none listens on :4222, and run the daemon on config.toml (port 3030, data in ./data).
# The `daemon` profile: the crate optimised, dependencies as the test build has them.
run: setup
    bash scripts/nats.sh 127.0.0.1 4222 data/nats
    cargo run --profile daemon --locked --bin loomem -- serve --config config.toml

# Start (or `just cluster stop`) a three-node NATS JetStream cluster on loopback ports 4222-4224, data in ./data/nats-cluster.
cluster CMD="start":
    bash scripts/cluster.sh {{CMD}} data/nats-cluster

# Run every test: unit, router, integration (real daemon, real nats-server, real Lance tables)
# and the console's in headless Chromium (installs chromium and playwright-core when missing).
test:
    bash scripts/setup-tests.sh
    cargo test --locked --workspace

# Run the criterion benchmarks (release build; needs nats-server and the model).
bench *ARGS:
    cargo bench --locked {{ARGS}}

# Retrieval quality on a LongMemEval-format file (the `daemon` profile's binary; default: the
# shipped 62-question set): each haystack
# through the import pipeline, every question searched in each mode; results in
# bench-results/. ARGS: --modes bm25,vector,hybrid --roles user|all --limit N
bench-recall DATA="datasets/recall/loomem_recall_s30.json" *ARGS:
    cargo run --profile daemon --locked --bin loomem -- bench-recall run {{DATA}} {{ARGS}}

# Fuzz request bodies, dates, the rule extractor and the SQL guard for SECS seconds each (cargo-fuzz, nightly; first build 30-60 min).
fuzz SECS="60":
    rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    cd fuzz && for t in request_json dates rules sql_guard; do \
      mkdir -p corpus/$t; \
      cargo +nightly fuzz run $t --dev -s none --target-dir "$HOME/.cache/loomem/fuzz-target" corpus/$t seeds/$t -- -max_total_time={{SECS}} -max_len=4096; \
    done
