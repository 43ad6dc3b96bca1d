#!/usr/bin/env bash
# Start a local nats-server with JetStream on HOST:PORT (storage under DIR),
# unless something already listens there.
set -euo pipefail
host=${1:-127.0.0.1}
port=${2:-4222}
dir=${3:-data/nats}

listening() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }

if listening; then
  echo "nats: something already listens on $host:$port; using it"
  exit 0
fi
bin=$(command -v nats-server || echo /usr/sbin/nats-server)
mkdir -p "$dir"
nohup "$bin" -js -a "$host" -p "$port" -sd "$dir" >"$dir/nats-server.log" 2>&1 &
echo "nats: started nats-server -js on $host:$port (pid $!, log $dir/nats-server.log)"
for _ in $(seq 100); do
  listening && exit 0
  sleep 0.1
done
echo "nats: nats-server did not come up; see $dir/nats-server.log" >&2
exit 1
