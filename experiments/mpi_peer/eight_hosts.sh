#!/usr/bin/env bash
# The side-by-side timing of run.sh at p = 8: the emulated 8-host switch (1, 4, 16 MiB) and the
# 8-host ring of links (torus:8, each host linked to its two neighbours, the others' traffic
# forwarded by the hosts between; 1, 4 and 16 MiB), 200 Mbit/s links, REPS runs each (repetitions
# FIRST..FIRST+REPS-1). With Open MPI's own decision (0) forced: every hand-written algorithm that
# runs at p = 8 (the ring, the bidirectional ring, halving-doubling, recursive doubling, the
# tree), psum over gloo and MPI_Allreduce; with its ring (4): the two rings, psum and
# MPI_Allreduce (the others take 1.7-3x the ring's time at 4 and 16 MiB in the first runs); with
# its recursive doubling (3), segmented ring (5) or Rabenseifner's (6): the two rings, psum and MPI.
# NETWORKS (default both) picks some; FORCED (default "0 4") Open MPI's algorithms, FROM (default
# 1MiB), TO (16MiB) and FACTOR (4) the sizes, ORDER (default round-robin) bench's --order: blocks
# keeps a slow MPI algorithm's skew out of the next algorithm's calls. Needs root, Open MPI, the
# extra mpi.
# Usage: [FORCED=.] [FROM=.] [TO=.] [FACTOR=.] [ORDER=.] bash experiments/mpi_peer/eight_hosts.sh [REPS] [FIRST] [NETWORKS]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
first=${2:-1}
nets=${3:-switch torus:8}
rows=experiments/mpi_peer/rows
rings=ring,bidirectional_ring,psum,mpi  # beside each of Open MPI's forced algorithms but 0
every=ring,bidirectional_ring,halving_doubling,recursive_doubling,tree,psum,mpi
for rep in $(seq "$first" $((first + reps - 1))); do
  for net in $nets; do
    for alg in ${FORCED:-0 4}; do
      algorithms=$rings
      [[ $alg == 0 ]] && algorithms=$every
      OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=$alg \
      JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 8 --topology "$net" \
        --link 200Mbit --launcher mpirun --timeout 900 -- \
        bench --algorithms "$algorithms" -b "${FROM:-1MiB}" -e "${TO:-16MiB}" \
        -f "${FACTOR:-4}" --no-uneven -n 3 -w 1 --order "${ORDER:-round-robin}" \
        --out "$rows/${net%%:*}8_run${rep}_alg${alg}.jsonl"
    done
  done
done
