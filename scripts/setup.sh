#!/usr/bin/env bash
# Install what loomem needs on a bare Debian machine with only the Rust toolchain:
# protoc (lance's build), nats-server (the JetStream bus and the tests), just.
# Idempotent: anything already present is left alone.
set -euo pipefail

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need_apt+=(nats-server)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)

if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v just >/dev/null 2>&1; then
  echo "setup: installing just"
  if command -v pip >/dev/null 2>&1 && pip install -q rust-just 2>/dev/null && command -v just >/dev/null 2>&1; then
    :
  else
    cargo install --locked just
  fi
fi

# polars: the analysts' side; the interop tests load loomem's Parquet and Arrow output with it.
if ! python3 -c 'import polars' >/dev/null 2>&1; then
  echo "setup: installing polars (Python) for the interop tests"
  python3 -m pip install -q polars 2>/dev/null || python3 -m pip install -q --break-system-packages polars
fi

echo "setup: ok (protoc $(protoc --version | cut -d' ' -f2), $(just --version))"
