#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + AddressSanitizer + UBSan) in a build
# folder of their own and runs each for a bounded time from its committed seed corpus.
# A crash leaves its input in <build>/artifacts/ and fails the script.
#   scripts/fuzz.sh                 # every target, CHARM_FUZZ_SECONDS (default 20) each
#   scripts/fuzz.sh fuzz_wire       # one target
# Environment: CHARM_FUZZ_BUILD_DIR (default build-fuzz), CHARM_FUZZ_SECONDS.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${CHARM_FUZZ_BUILD_DIR:-build-fuzz}"
seconds="${CHARM_FUZZ_SECONDS:-20}"
targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCHARM_FUZZ=ON -DCHARM_TESTS=OFF "${launcher[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target "${targets[@]}"

mkdir -p "$build_dir/artifacts"
for target in "${targets[@]}"; do
  name="${target#fuzz_}"
  work="$build_dir/corpus/$name"  # new inputs go here; the committed seeds stay as they are
  mkdir -p "$work"
  rm -f "$build_dir"/artifacts/"$target"-*  # findings of an earlier run
  echo "fuzz: $target for ${seconds}s"
  "$build_dir/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/$target-" \
    "$work" "tests/fuzz/corpus/$name" 2>&1 | grep -E "(DONE|==[0-9]+==|SUMMARY|stat::number_of_executed_units|INFO: Running with|.*(ERROR|Error|crash|leak|Test unit written))" \
    | grep -v "NEW_FUNC" || true  # coverage notes name functions such as charm::ErrorMsg
  # libFuzzer's exit status is lost in the pipe: a crash is an artifact file.
  if compgen -G "$build_dir/artifacts/$target-*" >/dev/null; then
    echo "fuzz: $target FAILED; inputs: $(ls "$build_dir"/artifacts/"$target"-*)" >&2
    exit 1
  fi
done
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without a finding"
