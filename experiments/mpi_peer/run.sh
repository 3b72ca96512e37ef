#!/usr/bin/env bash
# MPI_Allreduce beside the hand-written ring and halving-doubling and XLA's psum over gloo, on
# the emulated 4-host switch (200 Mbit/s links), one run per Open MPI algorithm forced through
# coll_tuned (0 = Open MPI's own choice), REPS runs each; every run times all four side by side
# (round robin). Needs root, Open MPI, the extra mpi.
# Usage: bash experiments/mpi_peer/run.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
rows=experiments/mpi_peer/rows
for rep in $(seq "$reps"); do
  for alg in 0 3 4 5 6; do
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
    JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun \
      --counters "$rows/counters_alg${alg}_run${rep}.json" -- \
      bench --algorithms ring,halving_doubling,psum,mpi -b 1MiB -e 16MiB -f 4 --no-uneven \
      -n 5 -w 1 --out "$rows/run${rep}_alg${alg}.jsonl" --plot "$rows/run${rep}_alg${alg}.png"
  done
done
