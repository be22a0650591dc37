#!/usr/bin/env bash
# Exit codes and messages of `charm` for bad invocations (no model needed):
# 2 = invalid input (flags, config), 1 = other failures, and always "charm: <message>"
# for charm's own errors, never an uncaught exception.
# Usage: test_cli.sh <path to charm>
set -u
charm=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute: some cases run from another folder
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect <status> <stderr substring> -- <argv...>
expect() {
  local want=$1 text=$2
  shift 3
  timeout 60 "$charm" "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [[ $got -ne $want ]] || { [[ -n $text ]] && ! grep -qF -- "$text" "$tmp/err"; } ||
     grep -q "terminate called" "$tmp/err"; then
    echo "FAIL: charm $* -> status $got (want $want), stderr:"; cat "$tmp/err"
    failures=$((failures + 1))
  else
    echo "ok: charm $* -> $got"
  fi
}

printf 'model: [unclosed\n' >"$tmp/bad.yaml"
printf 'model: /nonexistent/model\nmode: single-node\nbogus_key: 1\n' >"$tmp/unknown-key.yaml"

expect 2 "subcommand" -- 
expect 2 "--config" -- serve
expect 2 "--name" -- worker --config "$tmp/bad.yaml"
expect 2 "max-tokens" -- run --config "$tmp/bad.yaml" --max-tokens 0 hello
expect 2 "temperature" -- run --config "$tmp/bad.yaml" --temperature -1 hello
expect 2 "charm: " -- serve --config "$tmp/bad.yaml"
expect 2 "bogus_key" -- run --config "$tmp/unknown-key.yaml" hello
expect 2 "charm: " -- status --config "$tmp/bad.yaml"
expect 1 "charm: " -- serve --config "$tmp/missing.yaml"
expect 0 "" -- --help
# Prefetch and trace flags: a bad prefetch value in YAML, an unwritable trace file.
printf 'model: %s\nmode: single-node\nprefetch: maybe\n' "$(dirname "$0")/../fixtures/models/olmoe-tiny" >"$tmp/bad-prefetch.yaml"
printf 'model: %s\nmode: single-node\n' "$(cd "$(dirname "$0")/../fixtures/models/olmoe-tiny" && pwd)" >"$tmp/olmoe.yaml"
expect 2 "prefetch: expected true or false" -- run --config "$tmp/bad-prefetch.yaml" hello
expect 2 "--routing-trace /nonexistent/t.jsonl: its folder /nonexistent does not exist" -- run --config "$tmp/olmoe.yaml" --routing-trace /nonexistent/t.jsonl hello
expect 0 "prefetch recall" -- run --config "$tmp/olmoe.yaml" --prefetch --max-tokens 3 --temperature 0 --routing-trace "$tmp/t.jsonl" --stats-json "$tmp/s.json" hello
# quant_dense is lossy and says so; a bad value is named.
expect 0 "quant_dense q8_0 is LOSSY" -- run --config "$tmp/olmoe.yaml" --quant-dense q8_0 --max-tokens 2 hello
expect 2 "--quant-dense" -- run --config "$tmp/olmoe.yaml" --quant-dense q5_k hello
# The YAML key alone turns prefetch on; --no-prefetch overrides it.
printf 'prefetch: true\n' >>"$tmp/olmoe.yaml"
expect 0 "prefetch recall" -- run --config "$tmp/olmoe.yaml" --max-tokens 2 hello
timeout 60 "$charm" run --config "$tmp/olmoe.yaml" --no-prefetch --max-tokens 2 hello >/dev/null 2>"$tmp/err"
if grep -q "prefetch recall" "$tmp/err"; then
  echo "FAIL: --no-prefetch did not override prefetch: true"
  failures=$((failures + 1))
fi
if [[ $(wc -l <"$tmp/t.jsonl") -ne $((3 * 3)) ]] || ! grep -q '"decode_tokens_per_s"' "$tmp/s.json"; then
  echo "FAIL: routing trace should have 3 layers x 3 steps (prefill + 2 decodes) lines; stats JSON its fields"
  failures=$((failures + 1))
fi
# --repeat runs the request again in the same process; without the prefix cache every run
# computes the whole prompt (its KV blocks are not reused), and --stats-json lists each run.
expect 0 "run 1 of 2: prompt tokens: 1, generated tokens: 2" -- run --config "$tmp/olmoe.yaml" --repeat 2 --no-prefix-cache --max-tokens 2 \
  --temperature 0 --stats-json "$tmp/r.json" hello
if ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); r = d["runs"]
sys.exit(0 if len(r) == 2 and d["prefix_cache"] is False and all(x["completion_tokens"] == 2 for x in r) else 1)' "$tmp/r.json"; then
  echo "FAIL: --repeat 2 --stats-json should list two runs of 2 tokens with prefix_cache false"; cat "$tmp/r.json"
  failures=$((failures + 1))
fi
expect 0 "runs after the first reuse the prompt's full 16-token KV blocks" -- run --config "$tmp/olmoe.yaml" --repeat 2 --max-tokens 1 hello
expect 2 "--repeat" -- run --config "$tmp/olmoe.yaml" --repeat 0 hello
# A model with linear attention never uses the prefix cache: no warning, and the stats say so.
printf 'model: %s\nmode: single-node\n' "$(cd "$(dirname "$0")/../fixtures/models/qwen3-next-tiny" && pwd)" >"$tmp/next.yaml"
timeout 60 "$charm" run --config "$tmp/next.yaml" --repeat 2 --max-tokens 1 --stats-json "$tmp/n.json" hello \
  >/dev/null 2>"$tmp/err"
if grep -q "reuse the prompt" "$tmp/err" || ! grep -q '"prefix_cache": false' "$tmp/n.json"; then
  echo "FAIL: qwen3-next --repeat 2: no prefix-cache warning and \"prefix_cache\": false expected"; cat "$tmp/err"
  failures=$((failures + 1))
fi
expect 2 "--out" -- convert --checkpoint "$tmp"
expect 2 "quant" -- convert --checkpoint "$tmp" --out "$tmp/c" --quant fp8
expect 2 "--worker needs --config" -- convert --checkpoint "$tmp" --out "$tmp/c" --worker w0
expect 2 "checkpoint directory $tmp/absent does not exist" -- convert --checkpoint "$tmp/absent" --out "$tmp/c"
expect 2 "$tmp/bad.yaml is neither a checkpoint directory" -- convert --checkpoint "$tmp/bad.yaml" --out "$tmp/c"

# Paths in errors (issue 12, item 11): every path a user gives is printed as resolved and,
# when written relative, with what it was resolved against: the YAML's folder for YAML
# values, the current directory for command-line paths.
mkdir -p "$tmp/cfg" "$tmp/models/empty"
olmoe_dir="$(cd "$(dirname "$0")/../fixtures/models/olmoe-tiny" && pwd)"
ln -s "$olmoe_dir" "$tmp/models/olmoe"
printf 'model: ../models/absent\nmode: single-node\n' >"$tmp/cfg/absent.yaml"
printf 'model: ../models/empty\nmode: single-node\n' >"$tmp/cfg/empty.yaml"
printf 'model: ../models/olmoe\nmode: single-node\nstore: {container: ../experts}\n' >"$tmp/cfg/container.yaml"
printf 'model: ../models/olmoe\nmode: single-node\nstore: {pin: hot.json}\n' >"$tmp/cfg/pin.yaml"
printf 'model: ../models/olmoe\nmode: single-node\nstore: {usage_file: stats/usage.json}\n' >"$tmp/cfg/usage.yaml"
printf 'model: ../models/olmoe\nmode: single-node\ncluster: {secret_file: keys/s.key}\n' >"$tmp/cfg/secret.yaml"
printf 'model: ../models/olmoe\nmode: single-node\napi: {api_key_file: api.key}\n' >"$tmp/cfg/apikey.yaml"
touch "$tmp/a-file"
cd "$tmp"
expect 2 "checkpoint directory $tmp/models/absent (resolved from '../models/absent' against $tmp/cfg) does not exist" -- \
  run --config cfg/absent.yaml hello
expect 2 "$tmp/models/empty/config.json: missing or unreadable (in $tmp/models/empty, resolved from '../models/empty' against $tmp/cfg)" -- \
  run --config cfg/empty.yaml hello
expect 1 "topology file $tmp/cfg/nope.yaml (resolved from 'cfg/nope.yaml' against $tmp) does not exist" -- \
  serve --config cfg/nope.yaml
expect 2 "(in $tmp/experts, resolved from '../experts' against $tmp/cfg)" -- run --config cfg/container.yaml hello
expect 2 "pin file $tmp/cfg/hot.json (resolved from 'hot.json' against $tmp/cfg) does not exist" -- \
  run --config cfg/pin.yaml hello
expect 2 "usage_file $tmp/cfg/stats/usage.json (resolved from 'stats/usage.json' against $tmp/cfg): its folder" -- \
  run --config cfg/usage.yaml hello
expect 2 "cluster.secret_file: file $tmp/cfg/keys/s.key (resolved from 'keys/s.key' against $tmp/cfg) cannot be read" -- \
  run --config cfg/secret.yaml hello
expect 2 "api.api_key_file: file $tmp/cfg/api.key (resolved from 'api.key' against $tmp/cfg) cannot be read" -- \
  run --config cfg/apikey.yaml hello
expect 2 "checkpoint directory $tmp/models/nope (resolved from 'models/nope' against $tmp) does not exist" -- \
  convert --checkpoint models/nope --out c
expect 1 "cannot create the container directory $tmp/a-file/c (resolved from 'a-file/c' against $tmp)" -- \
  convert --checkpoint models/olmoe --out a-file/c
for flag in --logits-out --ids-out --stats-json --routing-trace; do
  expect 2 "$flag $tmp/no/dir/x (resolved from 'no/dir/x' against $tmp): its folder $tmp/no/dir does not exist" -- \
    run --config cfg/absent.yaml "$flag" no/dir/x hello
done
expect 1 "bench memory: cannot write $tmp/no/m.json (resolved from 'no/m.json' against $tmp)" -- \
  bench memory --array-mib 1 --repeat 1 --threads 1 --json no/m.json
cd - >/dev/null
expect 2 "ram-gb" -- worker --config "$tmp/bad.yaml" --name a --ram-gb -1
expect 2 "ram-gb" -- serve --config "$tmp/bad.yaml" --ram-gb 0

# A checkpoint whose config.json names an unsupported architecture, or a supported one
# with a required field missing: `charm run` names the architecture / the field and the
# file (the weights are the mixtral-tiny fixture's, linked).
fixture="$(cd "$(dirname "$0")/../fixtures/models/mixtral-tiny" && pwd)"
for case in unsupported missing; do
  mkdir -p "$tmp/$case"
  ln -s "$fixture/model.safetensors" "$tmp/$case/model.safetensors"
  ln -s "$fixture/tokenizer.json" "$tmp/$case/tokenizer.json"
  cp "$fixture/tokenizer_config.json" "$tmp/$case/"
  printf 'model: %s\nmode: single-node\n' "$tmp/$case" >"$tmp/$case.yaml"
done
sed 's/"MixtralForCausalLM"/"DbrxForCausalLM"/' "$fixture/config.json" >"$tmp/unsupported/config.json"
grep -v '"num_local_experts"' "$fixture/config.json" >"$tmp/missing/config.json"
expect 1 "$tmp/unsupported/config.json: architecture 'DbrxForCausalLM' is not supported" -- \
  run --config "$tmp/unsupported.yaml" hello
expect 2 "$tmp/missing/config.json: missing required field 'num_local_experts'" -- \
  run --config "$tmp/missing.yaml" hello

# charm bench memory: a bench subcommand is required; arrays beyond the RAM are refused
# before allocating; a small run prints every STREAM kernel and writes its JSON.
expect 2 "subcommand" -- bench
expect 2 "lower --array-mib" -- bench memory --array-mib 1000000
# charm bench wire: each bad argument named (the protocol's hidden-size cap once aborted it)
expect 2 "--hidden 1048577: 1..1048576" -- bench wire --hidden 1048577 --tokens 1 --repeat 10
expect 2 "--tokens: every batch size must be at least 1" -- bench wire --tokens 0 --repeat 10
expect 2 "--top-k 300: 1..min(--experts 300, 256)" -- bench wire --top-k 300 --experts 300 --repeat 10
expect 2 "--repeat 3: at least 10" -- bench wire --repeat 3
expect 0 "" -- bench wire --hidden 64 --experts 16 --top-k 4 --tokens 1 --repeat 10
expect 0 "" -- bench memory --array-mib 8 --repeat 2 --threads 2 --json "$tmp/memory.json"
for kernel in copy scale add triad; do
  if ! grep -q "^$kernel " "$tmp/out" || ! grep -q "\"$kernel\"" "$tmp/memory.json"; then
    echo "FAIL: charm bench memory printed or wrote no $kernel rate"; failures=$((failures + 1))
  fi
done

# charm secret new: 64 hex digits and a newline, mode 0600; never overwrites.
expect 0 "" -- secret new "$tmp/cluster.secret"
if [[ $(stat -c %a "$tmp/cluster.secret") != 600 ]] || ! grep -qxE '[0-9a-f]{64}' "$tmp/cluster.secret" ||
   [[ $(wc -c <"$tmp/cluster.secret") -ne 65 ]]; then
  echo "FAIL: charm secret new wrote $(stat -c %a "$tmp/cluster.secret") $(wc -c <"$tmp/cluster.secret") bytes"
  failures=$((failures + 1))
fi
cp "$tmp/cluster.secret" "$tmp/before"
expect 2 "already exists" -- secret new "$tmp/cluster.secret"
cmp -s "$tmp/cluster.secret" "$tmp/before" || { echo "FAIL: charm secret new changed an existing file"; failures=$((failures + 1)); }
expect 2 "subcommand" -- secret
expect 1 "cannot create" -- secret new /nonexistent/dir/s
chmod 644 "$tmp/before"
printf 'model: /nonexistent/model\ncluster: {secret_file: %s}\nworkers:\n  - {name: w0, port: 7701, experts: 0-3}\n' \
  "$tmp/before" >"$tmp/open-secret.yaml"
expect 2 "chmod 600" -- worker --config "$tmp/open-secret.yaml" --name w0

# Secure by default on a LAN: a worker or the API on an address other machines can reach,
# without a secret / key, refuses to start (before loading anything) and says how to make
# one; `insecure: true` lets it start with a warning; loopback needs nothing. The model
# does not exist, so a start that gets past the check fails on it instead (nothing binds).
lan_worker() {  # lan_worker <host> <extra cluster keys>
  printf 'model: /nonexistent/model\ncluster: {%s}\nworkers:\n  - {name: w0, host: "%s", port: 7701, experts: 0-3}\n' \
    "$2" "$1" >"$tmp/lan.yaml"
}
for host in 0.0.0.0 :: 192.168.77.10; do
  lan_worker "$host" ""
  expect 2 "charm secret new cluster.secret" -- worker --config "$tmp/lan.yaml" --name w0
  lan_worker "$host" "insecure: true"
  expect 2 "checkpoint directory /nonexistent/model does not exist" -- worker --config "$tmp/lan.yaml" --name w0
  grep -q "WITHOUT AUTHENTICATION because cluster.insecure is true" "$tmp/err" ||
    { echo "FAIL: no warning for cluster.insecure on $host"; failures=$((failures + 1)); }
  lan_worker "$host" "secret_file: $tmp/cluster.secret"
  expect 2 "checkpoint directory /nonexistent/model does not exist" -- worker --config "$tmp/lan.yaml" --name w0
done
for host in 127.0.0.1 127.0.0.2 ::1 localhost; do
  lan_worker "$host" ""
  expect 2 "checkpoint directory /nonexistent/model does not exist" -- worker --config "$tmp/lan.yaml" --name w0
done
api_config() {  # api_config <host> <extra api keys>
  printf 'model: /nonexistent/model\nmode: single-node\napi: {host: "%s", port: 8080%s}\n' "$1" "$2" >"$tmp/api.yaml"
}
api_config 0.0.0.0 ""
expect 2 "charm secret new api.key" -- serve --config "$tmp/api.yaml"
api_config 0.0.0.0 ", insecure: true"
expect 2 "checkpoint directory /nonexistent/model does not exist" -- serve --config "$tmp/api.yaml"
grep -q "WITHOUT AUTHENTICATION because api.insecure is true" "$tmp/err" ||
  { echo "FAIL: no warning for api.insecure"; failures=$((failures + 1)); }
api_config 0.0.0.0 ", api_key_file: $tmp/cluster.secret"
expect 2 "checkpoint directory /nonexistent/model does not exist" -- serve --config "$tmp/api.yaml"
api_config 127.0.0.1 ""
expect 2 "checkpoint directory /nonexistent/model does not exist" -- serve --config "$tmp/api.yaml"
expect 2 "the HTTP API would listen on 0.0.0.0:9" -- serve --config "$tmp/api.yaml" --host 0.0.0.0 --port 9

# charm plan on the committed two-worker fixture topology: a table and valid JSON (the
# workers are not running: they show as unreachable with the assumed RTT). Probes run
# for real (small: the fixture's shard); the cache goes to $tmp.
plan_env=(env CHARM_CACHE="$tmp/plan-cache")
configs=$(cd "$(dirname "$0")/../../configs" && pwd)
if "${plan_env[@]}" timeout 120 "$charm" plan --config "$configs/local-cluster.yaml" --timeout-ms 200 >"$tmp/plan.txt" 2>"$tmp/err" &&
   head -1 "$tmp/plan.txt" | grep -q "^WORKER " && grep -q "^w0 " "$tmp/plan.txt" && grep -q "^w1 " "$tmp/plan.txt" &&
   grep -q "predicted decode (one stream): .* tok/s.*bottleneck: " "$tmp/plan.txt" &&
   [[ -s "$tmp/plan-cache/plan-probes.json" ]]; then
  echo "ok: charm plan prints a table"
else
  echo "FAIL: charm plan table:"; cat "$tmp/plan.txt" "$tmp/err"; failures=$((failures + 1))
fi
if "${plan_env[@]}" timeout 120 "$charm" plan --config "$configs/local-cluster.yaml" --timeout-ms 200 --json >"$tmp/plan.json" 2>"$tmp/err" &&
   python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "charm-plan" and j["version"] == 1, j
assert [w["name"] for w in j["workers"]] == ["w0", "w1"], j["workers"]
assert j["prediction"]["tokens_per_s"] > 0 and j["prediction"]["bottleneck"] in ("compute", "memory", "disk", "network")
assert j["coordinator"]["memory_source"] == "cached", j["coordinator"]  # the first run cached it
' "$tmp/plan.json"; then
  echo "ok: charm plan --json is valid JSON with its fields"
else
  echo "FAIL: charm plan --json:"; cat "$tmp/plan.json" "$tmp/err"; failures=$((failures + 1))
fi
printf '{"format": "charm-expert-usage", "counts": [[0, 1' >"$tmp/bad-usage.json"
expect 2 "--config" -- plan
expect 2 "no-such.yaml does not exist" -- plan --config "$tmp/no-such.yaml"
expect 2 "charm: " -- plan --config "$tmp/bad.yaml"
CHARM_CACHE="$tmp/plan-cache" expect 2 "--usage $tmp/nope.json does not exist" -- plan --config "$configs/local-cluster.yaml" --timeout-ms 200 --usage "$tmp/nope.json"
CHARM_CACHE="$tmp/plan-cache" expect 2 "--usage: $tmp/bad-usage.json" -- plan --config "$configs/local-cluster.yaml" --timeout-ms 200 --usage "$tmp/bad-usage.json"

# charm re-executes itself with OMP_WAIT_POLICY=passive (and, for a process that
# computes alone as `bench` does, libgomp's spin count: app/openmp_wait.h); the process
# keeps the name `charm` (it was `exe`, and `pgrep charm` found nothing while a cluster
# served).
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$charm" bench memory --help >/dev/null 2>&1  # warms the page cache
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$charm" bench memory >/dev/null 2>&1 &
pid=$!
name="" spin=""
for _ in $(seq 200); do  # at most 10 s
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx OMP_WAIT_POLICY=passive; then
    name=$(cat "/proc/$pid/comm" 2>/dev/null)
    spin=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep '^GOMP_SPINCOUNT=' || true)
    break
  fi
  sleep 0.05
done
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
if [[ $name == charm ]]; then
  echo "ok: the re-executed process is named charm"
else
  echo "FAIL: the re-executed process is named '$name', not charm"
  failures=$((failures + 1))
fi
if [[ $spin == GOMP_SPINCOUNT=3000 ]]; then
  echo "ok: charm bench spins before it sleeps"
else
  echo "FAIL: charm bench's environment has '$spin', not GOMP_SPINCOUNT=3000"
  failures=$((failures + 1))
fi

# The re-exec reads only the topology's mode: the real load's warnings (here a key file
# its group can read) reach stderr once, never `charm run`'s stdout (the generated text).
cp "$tmp/cluster.secret" "$tmp/group.key"
chmod 640 "$tmp/group.key"
printf 'model: /nonexistent/model\nmode: single-node\napi: {api_key_file: %s}\n' "$tmp/group.key" >"$tmp/group.yaml"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT timeout 60 "$charm" run --config "$tmp/group.yaml" hello >"$tmp/out" 2>"$tmp/err"
if [[ -s $tmp/out ]] || [[ $(grep -c "readable by its group" "$tmp/err") -ne 1 ]]; then
  echo "FAIL: a topology warning went to stdout or not once to stderr; stdout:"; cat "$tmp/out"; cat "$tmp/err"
  failures=$((failures + 1))
else
  echo "ok: the re-exec's topology read logs nothing"
fi

[[ $failures -eq 0 ]] && echo PASS
exit $((failures > 0))
