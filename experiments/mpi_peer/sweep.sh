#!/usr/bin/env bash
# The side-by-side timing of run.sh from 1 KiB to 64 MiB per host (1, 16, 256 KiB, 4, 64 MiB;
# run.sh has 1, 4, 16 MiB) on the emulated 4-host switch (200 Mbit/s links), REPS runs each
# (repetitions FIRST..FIRST+REPS-1): with Open MPI's own decision (0) forced, the hand-written
# ring, halving-doubling and recursive doubling, psum over gloo and MPI_Allreduce; with its
# ring (4), the ring, psum and MPI_Allreduce. FORCED (default "0 4") picks Open MPI's
# algorithms, FROM (default 1KiB) the smallest size. Needs root, Open MPI, the extra mpi.
# Usage: [FORCED=...] [FROM=SIZE] bash experiments/mpi_peer/sweep.sh [REPS] [FIRST]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
first=${2:-1}
rows=experiments/mpi_peer/rows
declare -A algorithms=([0]=ring,halving_doubling,recursive_doubling,psum,mpi [4]=ring,psum,mpi)
for rep in $(seq "$first" $((first + reps - 1))); do
  for alg in ${FORCED:-0 4}; do
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
    JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun \
      --timeout 900 -- \
      bench --algorithms "${algorithms[$alg]}" -b "${FROM:-1KiB}" -e 64MiB -f 16 --no-uneven -n 3 -w 1 \
      --out "$rows/sweep_run${rep}_alg${alg}.jsonl"
  done
done
