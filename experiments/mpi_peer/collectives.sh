#!/usr/bin/env bash
# The hand-written ring, halving-doubling and recursive doubling with XLA's CPU collectives over
# MPI (--collectives mpi) and over gloo, on the emulated 4-host switch (200 Mbit/s links) under
# --launcher mpirun, 1-16 MiB, REPS runs of each (runs alternate mpi, gloo); then over MPI with
# Open MPI's TCP transport sending large messages in place of its RDMA-style put
# (btl_tcp_flags=send,inplace,need-ack,need-csum: "mpi_send"). Needs root, Open MPI and
# MPIwrapper (bash experiments/mpi_peer/build_mpiwrapper.sh).
# Usage: bash experiments/mpi_peer/collectives.sh [REPS [ARMS]]   (ARMS default "mpi gloo mpi_send")
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
arms=${2:-mpi gloo mpi_send}
rows=experiments/mpi_peer/rows
for rep in $(seq "$reps"); do
  for arm in $arms; do
    flags=()
    [[ $arm == mpi_send ]] && flags=(env OMPI_MCA_btl_tcp_flags=send,inplace,need-ack,need-csum)
    "${flags[@]}" env JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit \
      --launcher mpirun --collectives "${arm%_send}" -- \
      bench --algorithms ring,halving_doubling,recursive_doubling -b 1MiB -e 16MiB -f 4 \
      --no-uneven -n 3 -w 1 --out "$rows/collectives_${arm}_run${rep}.jsonl"
  done
done
