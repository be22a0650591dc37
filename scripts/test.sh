#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit and integration) with ctest.
#   scripts/test.sh [extra ctest arguments, e.g. -L unit or -R tokenizer]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir="${CHARM_BUILD_DIR:-build}"
ctest --test-dir "$build_dir" --output-on-failure --timeout 900 "$@"
