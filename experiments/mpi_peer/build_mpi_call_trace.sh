#!/usr/bin/env bash
# Builds mpi_call_trace.c (beside this script) and a copy of MPIwrapper (built first by
# build_mpiwrapper.sh) that loads it before Open MPI, into build/mpi_call_trace/, for
# steps.py --mpi-trace: every MPI_Irecv, MPI_Isend and MPI_Wait of XLA's MPI collectives
# stamped. Needs mpicc and patchelf (Debian: libopenmpi-dev patchelf). About 1 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/build/mpi_call_trace
wrapper=$root/build/mpiwrapper/lib/libmpiwrapper.so
[[ -f $wrapper ]] || { echo "build_mpi_call_trace.sh: no $wrapper (run build_mpiwrapper.sh first)" >&2; exit 2; }
command -v patchelf >/dev/null || { echo "build_mpi_call_trace.sh: no patchelf on PATH (Debian: apt-get install patchelf)" >&2; exit 2; }
mkdir -p "$out"
# built beside and renamed into place: a run still using the old libraries keeps them
mpicc -O2 -fPIC -shared "$root/experiments/mpi_peer/mpi_call_trace.c" -o "$out/.libmpi_call_trace.so.$$"
cp "$wrapper" "$out/.libmpiwrapper.so.$$"
patchelf --add-needed libmpi_call_trace.so "$out/.libmpiwrapper.so.$$"
patchelf --set-rpath '$ORIGIN' "$out/.libmpiwrapper.so.$$"  # finds it beside itself
mv -f "$out/.libmpi_call_trace.so.$$" "$out/libmpi_call_trace.so"
mv -f "$out/.libmpiwrapper.so.$$" "$out/libmpiwrapper.so"
echo "built $out/libmpiwrapper.so (MPIwrapper, MPI calls stamped by libmpi_call_trace.so)"
