#!/usr/bin/env bash
# The hand-written algorithms with XLA's CPU collectives over MPI (--collectives mpi) and over
# gloo, on the emulated switch (200 Mbit/s links) under --launcher mpirun, REPS runs of each arm.
# Needs root, Open MPI and MPIwrapper (bash experiments/mpi_peer/build_mpiwrapper.sh).
#
# Arms (run in the order given, alternating within each repetition):
#   mpi       ring, halving-doubling, recursive doubling at 1-16 MiB over MPI with Open MPI's
#             default TCP transport flags (large messages put: btl_tcp_flags=send,put,...)
#   mpi_send  the same with large messages sent (btl_tcp_flags=send,inplace,need-ack,need-csum)
#             in Open MPI's 128 KiB fragments
#   gloo      the same over gloo
#   steps     one message step alone (steps.py: one way, exchange, exchange + add, shift, the
#             add alone) at 1 KiB-16 MiB and the whole all-reduces at 16 MiB, both flag settings
#   variants  steps with the send flags and one more change each: tcp_slow_start_after_idle=0
#             in every host, TCP reno, 1 MiB, 32 KiB and 8 KiB fragments (32 KiB: the launcher's)
#   mca       steps at 4-16 MiB with the launcher's settings (send flags, 32 KiB fragments) and
#             one Open MPI parameter more each (steps.py --mca): a progress thread for the TCP
#             transport, two TCP connections per pair of ranks (hangs: no step done in 10 min),
#             fixed 256 KiB socket buffers, ranks yielding the CPU while waiting (the launcher's
#             since); VARIANTS (default all, "base": none more) picks some
#   trace     steps.py --split at 16 MiB with the launcher's settings: halving-doubling and
#             recursive doubling whole, step by step back to back and step by step after
#             barriers, every process's start and end of every call (5 rounds) and of every
#             MPI call inside them (build_mpi_call_trace.sh), and the whole ring,
#             halving-doubling and recursive doubling timed as in steps; XLA_VARIANTS (default
#             "default") adds XLA:CPU flags: noconc (no concurrency-optimized scheduler), eigen1
#             (no multi-threaded Eigen); or reno: TCP reno in every host; noidle:
#             tcp_slow_start_after_idle=0 in every host; progress: btl_tcp_progress_thread=1
#   ring8     over gloo on the 8-host switch: steps.py at 1 KiB and 2 MiB (a ring step of
#             16 MiB at p = 8 is a shift of 2 MiB; the add of 2 MiB) and the whole ring and psum
#             at 16 MiB, in one launch; ALLREDUCE=4MiB STEP=512KiB for 4 MiB (rows
#             collectives_ring8_4MiB_runR)
#   table     every hand-written algorithm that runs with one device per host, and psum, over
#             MPI with the launcher's settings (send flags, 32 KiB fragments, ranks yielding):
#             p = 4 at 1 KiB-16 MiB (3 calls) and 64 MiB (1 call), p = 8 at 1 and 16 MiB
# Usage: [FIRST=R] [VARIANTS=...] [ALLREDUCE=. STEP=.] bash experiments/mpi_peer/collectives.sh [REPS [ARMS]]
#   (ARMS default "mpi gloo mpi_send"; repetitions FIRST..FIRST+REPS-1, FIRST default 1)
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
arms=${2:-mpi gloo mpi_send}
rows=experiments/mpi_peer/rows
put=send,put,inplace,need-ack,need-csum,hetero-rdma  # Open MPI 4.1's default btl_tcp_flags
send=send,inplace,need-ack,need-csum                 # --collectives mpi's default flags
export OMPI_MCA_btl_tcp_max_send_size=131072          # Open MPI's default (the launcher's: 32 KiB)
export OMPI_MCA_mpi_yield_when_idle=0                # Open MPI's default here (the launcher's: 1)
every=ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,halving_doubling_near
every+=,naive,two_shot,swing,double_binary_tree,psum
cluster() {  # HOSTS COLLECTIVES -- COMMAND...
  local hosts=$1 collectives=$2
  shift 3
  JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts "$hosts" --link 200Mbit \
    --launcher mpirun --collectives "$collectives" --timeout 900 -- "$@"
}
bench=(bench --algorithms ring,halving_doubling,recursive_doubling -b 1MiB -e 16MiB -f 4
       --no-uneven -n 3 -w 1)
first=${FIRST:-1}  # the first repetition's number
for rep in $(seq "$first" $((first + reps - 1))); do
  for arm in $arms; do
    case $arm in
      mpi) OMPI_MCA_btl_tcp_flags=$put cluster 4 mpi -- "${bench[@]}" \
             --out "$rows/collectives_mpi_run${rep}.jsonl" ;;
      mpi_send) OMPI_MCA_btl_tcp_flags=$send cluster 4 mpi -- "${bench[@]}" \
             --out "$rows/collectives_mpi_send_run${rep}.jsonl" ;;
      gloo) cluster 4 gloo -- "${bench[@]}" --out "$rows/collectives_gloo_run${rep}.jsonl" ;;
      steps)
        for flags in mpi:$put mpi_send:$send; do
          OMPI_MCA_btl_tcp_flags=${flags#*:} cluster 4 mpi -- .venv/bin/python \
            experiments/mpi_peer/steps.py --sizes 1KiB,2MiB,4MiB,8MiB,16MiB --reps 5 \
            --out "$rows/collectives_steps_${flags%%:*}_run${rep}.jsonl"
        done ;;
      trace)  # the launcher's Open MPI settings (OMPI_MCA_* of this script's own unset)
        bash experiments/mpi_peer/build_mpi_call_trace.sh
        for v in ${XLA_VARIANTS:-default}; do  # one XLA:CPU flag more: rows collectives_trace_V_runR
          case $v in
            default) extra=() name=trace ;;
            noconc) extra=(--xla-flag=--xla_cpu_enable_concurrency_optimized_scheduler=false) ;;
            eigen1) extra=(--xla-flag=--xla_cpu_multi_thread_eigen=false) ;;
            reno) extra=() ;;  # TCP reno in every host instead of the machine's default (bbr)
            noidle) extra=(--sysctl tcp_slow_start_after_idle=0) ;;  # in every host
            progress) extra=(--mca btl_tcp_progress_thread=1) ;;     # Open MPI's TCP progress thread
            *) echo "collectives.sh: unknown trace variant '$v' (default, noconc, eigen1, reno," \
                 "noidle, progress)" >&2
               exit 2 ;;
          esac
          [[ $v == default ]] || name=trace_$v
          cc=()
          [[ $v == reno ]] && cc=(--congestion-control reno)
          env -u OMPI_MCA_btl_tcp_max_send_size -u OMPI_MCA_mpi_yield_when_idle \
            JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit "${cc[@]}" \
            --launcher mpirun --collectives mpi --timeout 900 -- .venv/bin/python \
            experiments/mpi_peer/steps.py --sizes "" --split halving_doubling,recursive_doubling \
            --reps 5 --mpi-trace "${extra[@]}" --out "$rows/collectives_${name}_run${rep}.jsonl"
        done ;;
      ring8)  # ALLREDUCE (default 16MiB) and its ring step STEP = ALLREDUCE / 8 (default 2MiB)
        name=ring8
        [[ ${ALLREDUCE:-16MiB} == 16MiB ]] || name=ring8_$ALLREDUCE
        cluster 8 gloo -- .venv/bin/python experiments/mpi_peer/steps.py \
          --sizes "1KiB,${STEP:-2MiB}" --allreduce "${ALLREDUCE:-16MiB}" --algorithms ring,psum \
          --reps 5 --out "$rows/collectives_${name}_run${rep}.jsonl" ;;
      table)  # the launcher's Open MPI settings (OMPI_MCA_* of this script's own unset)
        out=$rows/collectives_table_run${rep}.jsonl
        (
          unset OMPI_MCA_btl_tcp_max_send_size OMPI_MCA_mpi_yield_when_idle
          cluster 4 mpi -- bench --algorithms "$every" -b 1KiB -e 16MiB -f 4 --no-uneven -n 3 -w 1 \
            --out "$out"
          cluster 4 mpi -- bench --algorithms "$every" -b 64MiB -e 64MiB --no-uneven -n 1 -w 1 \
            --out "$out"
          cluster 8 mpi -- bench --algorithms "$every" -b 1MiB -e 16MiB -f 16 --no-uneven -n 3 \
            -w 1 --out "$out"
        ) ;;
      variants)  # steps with one more change each (rows collectives_steps_mpi_send_CHANGE_runR)
        for v in noidle reno 1MiBfrag 32KiBfrag 8KiBfrag; do
          size=131072 extra=() ccargs=()
          [[ $v == noidle ]] && extra=(--sysctl tcp_slow_start_after_idle=0)
          [[ $v == reno ]] && ccargs=(--congestion-control reno)
          [[ $v == 1MiBfrag ]] && size=1048576
          [[ $v == 32KiBfrag ]] && size=32768
          [[ $v == 8KiBfrag ]] && size=8192
          OMPI_MCA_btl_tcp_flags=$send OMPI_MCA_btl_tcp_max_send_size=$size \
            JAX_PLATFORMS=cpu .venv/bin/allreduce-jax cluster --hosts 4 --link 200Mbit \
            "${ccargs[@]}" --launcher mpirun --collectives mpi --timeout 900 -- .venv/bin/python \
            experiments/mpi_peer/steps.py --sizes 1KiB,2MiB,4MiB,8MiB,16MiB --reps 5 "${extra[@]}" \
            --out "$rows/collectives_steps_mpi_send_${v}_run${rep}.jsonl"
        done ;;
      mca)  # rows collectives_steps_mpi_send_32KiBfrag[_CHANGE]_runR
        for v in ${VARIANTS:-base progress links2 buf256k yield}; do
          case $v in
            base) extra=() ;;
            progress) extra=(--mca btl_tcp_progress_thread=1) ;;
            links2) extra=(--mca btl_tcp_links=2) ;;
            buf256k) extra=(--mca btl_tcp_sndbuf=262144 --mca btl_tcp_rcvbuf=262144) ;;
            yield) extra=() ;;  # the launcher's (OMPI_MCA_mpi_yield_when_idle=1 below)
            *) echo "collectives.sh: unknown variant '$v'" >&2; exit 2 ;;
          esac
          name=32KiBfrag
          [[ $v == base ]] || name+=_$v
          OMPI_MCA_mpi_yield_when_idle=$([[ $v == yield ]] && echo 1 || echo 0) \
          OMPI_MCA_btl_tcp_flags=$send OMPI_MCA_btl_tcp_max_send_size=32768 cluster 4 mpi -- \
            .venv/bin/python experiments/mpi_peer/steps.py --sizes 4MiB,8MiB,16MiB --reps 5 \
            "${extra[@]}" --out "$rows/collectives_steps_mpi_send_${name}_run${rep}.jsonl"
        done ;;
      *) echo "collectives.sh: unknown arm '$arm' (mpi, mpi_send, gloo, steps, variants, mca, trace, ring8, table)" >&2
         exit 2 ;;
    esac
  done
done
