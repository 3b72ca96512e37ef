#!/usr/bin/env bash
# Builds MPIwrapper against the local MPI (Open MPI's mpicc/mpifort) into build/mpiwrapper/ at the
# top of the checkout, for `allreduce-jax launch|cluster --collectives mpi`: jaxlib bundles
# MPItrampoline, which runs XLA's CPU collectives over the MPI library that MPITRAMPOLINE_LIB
# names, and that is build/mpiwrapper/lib/libmpiwrapper.so.
#   bash experiments/mpi_peer/build_mpiwrapper.sh [MPIWRAPPER_SOURCE_DIR]
# Without MPIWRAPPER_SOURCE_DIR it clones MPIwrapper into a temporary folder (needs git and the
# network; $MPIWRAPPER_REPO, if set, instead of GitHub's) and removes it after. Needs cmake, a C,
# C++ and Fortran compiler and an MPI with its headers (Debian: libopenmpi-dev gfortran cmake).
# mpi_thread_shim.c (beside this script) is linked in: it lets XLA's MPI collectives run from
# jaxlib's worker threads (see that file). About 15 s. The commit below (v2.11.1) is the one the
# committed rows were measured with.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
prefix=$root/build/mpiwrapper
commit=070c4e1b8a98fbe63ea8f84d046effb813c9febb
src=${1:-}
if [[ -z $src ]]; then
  src=$(mktemp -d /tmp/mpiwrapper-src.XXXXXX)
  trap 'rm -rf "$src"' EXIT  # the library is installed under $prefix: the clone is not needed after
  git clone -q "${MPIWRAPPER_REPO:-https://github.com/eschnett/MPIwrapper}" "$src"
  git -C "$src" checkout -q "$commit"
fi
src=$(cd "$src" && pwd)
[[ -f $src/src/mpiwrapper.cxx ]] || { echo "build_mpiwrapper.sh: $src is not an MPIwrapper source tree" >&2; exit 2; }
command -v mpicc >/dev/null || { echo "build_mpiwrapper.sh: no mpicc on PATH (Debian: apt-get install libopenmpi-dev)" >&2; exit 2; }
work=$(mktemp -d /tmp/mpiwrapper-build.XXXXXX)
trap 'rm -rf "$work"; [[ -n ${1:-} ]] || rm -rf "$src"' EXIT
here=$root/experiments/mpi_peer
mpicc -O2 -fPIC -c "$here/mpi_thread_shim.c" -o "$work/mpi_thread_shim.o"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_MODULE_LINKER_FLAGS="$work/mpi_thread_shim.o" >"$work/cmake.log" 2>&1 \
  || { tail -20 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" >/dev/null
cmake --install "$work/build" >/dev/null
echo "built $prefix/lib/libmpiwrapper.so against $(mpicc --showme:version 2>&1 | head -1) from $src"
