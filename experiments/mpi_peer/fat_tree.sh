#!/usr/bin/env bash
# The side-by-side timing of run.sh on the emulated 2:1 fat tree (4 hosts, 2 per leaf, 200 Mbit/s
# host links, leaf uplinks oversubscribed 2:1) at 4 and 16 MiB: the hand-written ring and
# halving-doubling, psum over gloo and MPI_Allreduce with Open MPI's own decision (0) and its
# ring (4) forced, REPS runs each (repetitions FIRST..FIRST+REPS-1). FORCED (default "0 4") picks
# Open MPI's algorithms; FROM, TO and FACTOR (default 4MiB, 16MiB, 4) the sizes, e.g.
# FORCED=4 FROM=1MiB TO=64MiB FACTOR=64 for 1 and 64 MiB; ORDER (default round-robin) bench's
# --order: blocks keeps a slow MPI algorithm's skew out of the next algorithm's calls. Needs root,
# Open MPI, the extra mpi.
# Usage: [FORCED=.] [FROM=.] [TO=.] [FACTOR=.] [ORDER=.] bash experiments/mpi_peer/fat_tree.sh [REPS] [FIRST]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
first=${2:-1}
rows=experiments/mpi_peer/rows
for rep in $(seq "$first" $((first + reps - 1))); do
  for alg in ${FORCED:-0 4}; do
    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
    JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --topology fat_tree:2:2 \
      --link 200Mbit --launcher mpirun --timeout 600 -- \
      bench --algorithms ring,halving_doubling,psum,mpi -b "${FROM:-4MiB}" -e "${TO:-16MiB}" \
      -f "${FACTOR:-4}" --no-uneven -n 5 -w 1 --order "${ORDER:-round-robin}" \
      --out "$rows/fat_tree_run${rep}_alg${alg}.jsonl"
  done
done
