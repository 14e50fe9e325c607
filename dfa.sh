#!/usr/bin/env bash
# Entry point for a newcomer and for CI.
#   ./dfa.sh run [dfa demo flags]   set up, build, run a verified forward+backward job on a local cluster
#   ./dfa.sh test                   set up, build, run every test (what .ci/run runs)
#   ./dfa.sh setup | build          the steps alone
# Environment: BUILD_DIR (default build), DFA_JOBS (parallel build jobs, default nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${DFA_JOBS:-$(nproc)}

# Debian packages the build, the tests and the local cluster need. Idempotent: installs only
# what is missing.
APT_PACKAGES=(cmake g++ make pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libabsl-dev libucx-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libopenblas-dev prometheus python3 python3-pip python3-dev openssl libssl-dev)

setup() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if [ -x deploy/setup-extra.sh ]; then deploy/setup-extra.sh; fi
}

build() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

case "${1:-}" in
  setup) setup ;;
  build) setup; build ;;
  run) shift; setup; build; exec "$BUILD_DIR/client/dfa" demo "$@" ;;
  test)
    setup; build
    ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "$JOBS" --timeout 900 ;;
  *) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
