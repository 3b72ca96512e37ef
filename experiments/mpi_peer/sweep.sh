#!/usr/bin/env bash
# The side-by-side timing of run.sh from 1 KiB to 64 MiB per host on the emulated 4-host switch
# (200 Mbit/s links): the hand-written ring, halving-doubling and recursive doubling, psum over
# gloo and MPI_Allreduce with Open MPI's own decision (0) and its ring (4) forced, REPS runs each
# (repetitions FIRST..FIRST+REPS-1). Needs root, Open MPI, the extra mpi.
# Usage: bash experiments/mpi_peer/sweep.sh [REPS] [FIRST]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
first=${2:-1}
rows=experiments/mpi_peer/rows
for rep in $(seq "$first" $((first + reps - 1))); do
  for alg in 0 4; do
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
    JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun \
      --timeout 900 -- \
      bench --algorithms ring,halving_doubling,recursive_doubling,psum,mpi -b 1KiB -e 64MiB -f 4 \
      --no-uneven -n 3 -w 1 --out "$rows/sweep_run${rep}_alg${alg}.jsonl"
  done
done
