#!/usr/bin/env bash
# Installs what is missing, builds, then serves the shipped model on this machine: two
# expert workers and a coordinator whose OpenAI-compatible API listens on
# http://127.0.0.1:8080/v1 (configs/local-cluster.yaml). Ctrl-C stops all three.
#   scripts/serve.sh [config.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/local-cluster.yaml}"
scripts/setup.sh
charm="${CHARM_BUILD_DIR:-build}/charm"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

# Start every worker the config names, then the coordinator. The script lives as long as
# the coordinator: a worker that dies leaves the cluster serving (its experts' replicas
# take over; without one, requests that need it fail with a clear error; `charm status`
# shows it down) until it is restarted by hand with the `charm worker` line below, when
# the coordinator reconnects it by itself (configs/replicas.yaml has replicas).
for name in $("$charm" workers --config "$config"); do
  echo "serve.sh: starting $charm worker --config $config --name $name"
  "$charm" worker --config "$config" --name "$name" &
  pids+=($!)
done
"$charm" serve --config "$config" &
serve_pid=$!
pids+=("$serve_pid")
wait "$serve_pid"
