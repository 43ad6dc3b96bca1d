#!/usr/bin/env bash
# A three-node NATS JetStream cluster on loopback for trying loomem on more
# than one server: clients on ports 4222-4224, routes on 6222-6224, storage
# under DIR/n1..n3. `stop` ends it. Point loomem at it with
#   LOOMEM_BUS__NATS_URL=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224
#   LOOMEM_BUS__REPLICAS=3
set -euo pipefail
cmd=${1:-start}
dir=${2:-data/nats-cluster}
bin=$(command -v nats-server || echo /usr/sbin/nats-server)
routes=nats://127.0.0.1:6222,nats://127.0.0.1:6223,nats://127.0.0.1:6224

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "$cmd" in
stop)
  for n in 1 2 3; do
    if [ -f "$dir/n$n/pid" ]; then
      kill "$(cat "$dir/n$n/pid")" 2>/dev/null || true
      rm -f "$dir/n$n/pid"
    fi
  done
  echo "cluster: stopped"
  ;;
start)
  for n in 1 2 3; do
    port=$((4221 + n))
    if listening "$port"; then
      echo "cluster: something already listens on 127.0.0.1:$port; using it"
      continue
    fi
    mkdir -p "$dir/n$n"
    nohup "$bin" -js -n "loomem-n$n" -a 127.0.0.1 -p "$port" -sd "$dir/n$n" \
      --cluster_name loomem --cluster "nats://127.0.0.1:$((6221 + n))" --routes "$routes" \
      >"$dir/n$n/nats-server.log" 2>&1 &
    echo $! >"$dir/n$n/pid"
    echo "cluster: node n$n on 127.0.0.1:$port (pid $!, log $dir/n$n/nats-server.log)"
  done
  for port in 4222 4223 4224; do
    for _ in $(seq 100); do
      listening "$port" && break
      sleep 0.1
    done
    listening "$port" || { echo "cluster: 127.0.0.1:$port did not come up; see $dir" >&2; exit 1; }
  done
  echo "cluster: up; LOOMEM_BUS__NATS_URL=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224 LOOMEM_BUS__REPLICAS=3"
  ;;
*)
  echo "usage: scripts/cluster.sh [start|stop] [DIR]" >&2
  exit 2
  ;;
esac
