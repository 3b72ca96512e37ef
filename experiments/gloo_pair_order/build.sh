#!/usr/bin/env bash
# Builds exchange (next to this script) against gloo's sources.
#   bash experiments/gloo_pair_order/build.sh [GLOO_SOURCE_DIR]
# Without GLOO_SOURCE_DIR it clones gloo into a temporary folder (needs git and the network;
# $GLOO_REPO, if set, instead of GitHub's) and removes it after. Needs cmake and a C++17
# compiler. The commit below is the one the committed rows were measured with; its TCP
# pair's send/recv code is the same at gloo's newest commit of 2025-05 (cc44198).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
commit=5354032ea08eadd7fc4456477f7f7c6308818509
src=${1:-}
if [[ -z $src ]]; then
  src=$(mktemp -d /tmp/gloo-src.XXXXXX)
  trap 'rm -rf "$src"' EXIT  # the program links gloo statically: the clone is not needed after
  git clone -q "${GLOO_REPO:-https://github.com/facebookincubator/gloo}" "$src"
  git -C "$src" checkout -q "$commit"
fi
[[ -f $src/gloo/transport/tcp/pair.cc ]] || { echo "build.sh: $src is not a gloo source tree" >&2; exit 2; }
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DUSE_REDIS=OFF -DUSE_IBVERBS=OFF \
  -DBUILD_TEST=OFF -DBUILD_BENCHMARK=OFF >/dev/null
cmake --build "$src/build" --target gloo -j "$(nproc)" >/dev/null
g++ -O2 -std=c++17 -I"$src" -I"$src/build" "$here/exchange.cc" "$src/build/gloo/libgloo.a" \
  -lpthread -o "$here/exchange"
echo "built $here/exchange against $src"
