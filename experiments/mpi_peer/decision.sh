#!/usr/bin/env bash
# Which algorithm Open MPI's own decision (coll_tuned, no algorithm forced) runs for a float32
# sum MPI_Allreduce of 1 KiB to 64 MiB per rank at p = 4 and 8: rank 0 runs under gdb with a
# breakpoint on each of Open MPI's all-reduce algorithms (ompi_coll_base_allreduce_intra_*),
# on this machine (the decision depends on the number of ranks and the size, not the network).
# Writes rows/decision.txt. Needs Open MPI, gdb and mpi4py (the extra mpi).
# Usage: bash experiments/mpi_peer/decision.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/ar.py" <<'PY'
import numpy as np
from mpi4py import MPI
for n in (1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20):
  if MPI.COMM_WORLD.rank == 0:
    print("size", n, flush=True)
  MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, np.ones(n // 4, np.float32))
PY
{
  echo "set breakpoint pending on"
  for a in basic_linear nonoverlapping recursivedoubling redscat_allgather ring ring_segmented; do
    echo "break ompi_coll_base_allreduce_intra_$a"
  done
  printf 'commands 1-6\ncontinue\nend\nrun\n'
} > "$tmp/gdb"
cat > "$tmp/rank.sh" <<SH
#!/bin/sh
[ "\$OMPI_COMM_WORLD_RANK" = 0 ] || exec "\$@"
exec gdb -q -batch -x "$tmp/gdb" --args "\$@" > "$tmp/out" 2>&1
SH
chmod +x "$tmp/rank.sh"
out=experiments/mpi_peer/rows/decision.txt
echo "# $(mpirun --version | head -1): size per rank (bytes) -> the algorithm its decision ran" > "$out"
for p in 4 8; do
  mpirun --allow-run-as-root --oversubscribe -np "$p" --mca pml ob1 --mca btl tcp,self \
    "$tmp/rank.sh" .venv/bin/python "$tmp/ar.py" > /dev/null
  grep -E "^size|hit Breakpoint" "$tmp/out" \
    | sed -E 's/^size /size=/; s/.* in ompi_coll_base_allreduce_intra_([a-z_]+).*/\1/' \
    | paste -d' ' - - | sed "s/^/p=$p /" >> "$out"
done
cat "$out"
