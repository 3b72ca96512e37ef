#!/usr/bin/env bash
# Bytes on the wire per all-reduce, per algorithm, against its schedule: on the emulated 4-host
# switch (200 Mbit/s links) under mpirun, one launch per Open MPI algorithm forced through
# coll_tuned (0 = Open MPI's own choice), each counting only MPI_Allreduce's calls (wire.py);
# the first also counts the hand-written ring, halving-doubling, recursive doubling and psum.
# REPS repetitions of the whole. Needs root, Open MPI, the extra mpi.
# Usage: bash experiments/mpi_peer/wire.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
rows=experiments/mpi_peer/rows
for rep in $(seq "$reps"); do
  for alg in 0 3 4 5 6; do
    algs=mpi
    [ "$alg" = 0 ] && algs=mpi,ring,halving_doubling,recursive_doubling,psum
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
    JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun \
      --timeout 600 -- .venv/bin/python experiments/mpi_peer/wire.py --algorithms "$algs" \
      --bytes 4MiB --reps 5 --out "$rows/wire_run${rep}.jsonl"
  done
done
