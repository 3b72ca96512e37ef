#!/usr/bin/env bash
# MPI_Allreduce beside the hand-written ring and halving-doubling and XLA's psum over gloo, on
# the emulated 4-host switch (200 Mbit/s links), one run per Open MPI algorithm forced through
# coll_tuned (0 = Open MPI's own choice), REPS runs each (repetitions FIRST..FIRST+REPS-1);
# every run times all four side by side. FORCED (default "0 3 4 5 6") picks Open MPI's
# algorithms; ORDER (default round-robin) bench's --order: blocks keeps a slow algorithm's skew
# out of the next algorithm's calls (rows and counters then end in _blocks). Needs root, Open
# MPI, the extra mpi.
# Usage: [FORCED=.] [ORDER=.] bash experiments/mpi_peer/run.sh [REPS] [FIRST]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
first=${2:-1}
order=${ORDER:-round-robin}
sfx=""
[[ $order == round-robin ]] || sfx=_$order
rows=experiments/mpi_peer/rows
for rep in $(seq "$first" $((first + reps - 1))); do
  for alg in ${FORCED:-0 3 4 5 6}; do
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
    JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun \
      --counters "$rows/counters_alg${alg}_run${rep}${sfx}.json" -- \
      bench --algorithms ring,halving_doubling,psum,mpi -b 1MiB -e 16MiB -f 4 --no-uneven \
      -n 5 -w 1 --order "$order" --out "$rows/run${rep}_alg${alg}${sfx}.jsonl" \
      --plot "$rows/run${rep}_alg${alg}${sfx}.png"
  done
done
