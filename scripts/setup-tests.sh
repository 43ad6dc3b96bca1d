#!/usr/bin/env bash
# What the test suite needs beyond scripts/setup.sh: Debian's Chromium and
# playwright-core (from the npm registry, pinned in ui-tests/package-lock.json)
# for the console's browser tests, and the official MCP Python SDK (PyPI `mcp`)
# for the OAuth client test, and moto's S3 server (PyPI `moto[server]`) for
# the object-storage tests. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup-tests: installing ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -d ui-tests/node_modules/playwright-core ] || [ ui-tests/package-lock.json -nt ui-tests/node_modules/.package-lock.json ]; then
  echo "setup-tests: installing playwright-core into ui-tests/"
  (cd ui-tests && npm ci --no-audit --no-fund --loglevel=error)
fi

if ! python3 -c 'import mcp.client.auth' >/dev/null 2>&1; then
  echo "setup-tests: installing the MCP Python SDK (mcp) for the OAuth test"
  python3 -m pip install -q "mcp==1.26.0" 2>/dev/null || python3 -m pip install -q --break-system-packages "mcp==1.26.0"
fi

# moto's S3 server: the bucket the object-storage tests keep their tables in.
if ! python3 -c 'import moto.server, flask_cors' >/dev/null 2>&1; then
  echo "setup-tests: installing moto[server] (Python) for the object-storage tests"
  python3 -m pip install -q "moto[server]==5.2.5" 2>/dev/null || python3 -m pip install -q --break-system-packages "moto[server]==5.2.5"
fi
