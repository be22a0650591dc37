#!/usr/bin/env bash
# Installs what charm needs to build and test on a fresh Debian 12 machine, then
# configures and builds it in ./build. Idempotent: packages already present are skipped,
# and the build is incremental.
#   scripts/setup.sh            # packages + Python test client + build everything
#   scripts/setup.sh charm      # ... + build only the named targets (serve.sh: the program)
# Environment: CHARM_BUILD_DIR (default build), CHARM_BUILD_TYPE (default Release).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  build-essential cmake pkg-config python3 python3-pip
  libasio-dev libcapnp-dev capnproto libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev
  doctest-dev libcpp-httplib-dev libpcre2-dev libcli11-dev libxxhash-dev libomp-dev
  iproute2  # ip netns / tc for tests/integration/test_failover.py
  libssl-dev
  # scripts/fuzz.sh: clang with its libFuzzer and sanitizer runtimes
  clang libclang-rt-dev
)
# Needed by the tests only, so installed only when everything (the tests) is built: the
# dashboard's browser test (tests/integration/test_dashboard.py) drives headless Chromium.
# `scripts/setup.sh charm` (serve.sh) stays light.
TEST_DEBIAN_PACKAGES=(chromium)
if (($# == 0)); then DEBIAN_PACKAGES+=("${TEST_DEBIAN_PACKAGES[@]}"); fi
# The integration tests drive the API with the official client and read YAML configs.
# numpy: the moefy writer test (tests/unit/test_moefy_writer.py) and scripts/moefy.py build;
# gguf: scripts/gen_gguf_fixtures.py (the GGUF copies of the model fixtures the tests read).
PYTHON_PACKAGES=(openai:openai yaml:pyyaml numpy:numpy gguf:gguf==0.19.0)  # module:package

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

for entry in "${PYTHON_PACKAGES[@]}"; do
  module="${entry%%:*}" package="${entry##*:}"
  python3 -c "import $module" 2>/dev/null || {
    echo "setup: installing Python package $package"
    python3 -m pip install -q "$package" 2>/dev/null || python3 -m pip install -q --break-system-packages "$package"
  }
done

build_dir="${CHARM_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${CHARM_BUILD_TYPE:-Release}" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
echo "setup: built $build_dir/charm"
