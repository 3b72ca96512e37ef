#!/usr/bin/env bash
# The measurements behind experiments/emulated_network/rows/ and experiments/gloo_pair_order/rows/
# (resumable: each step skips rows it has).
# As root, or rootless without it (steps 7-10 and 12 need cubic allowed for namespaces: root's
# sysctl once; step 11 builds both ways). Runs nice'd; about an hour at 200 Mbit/s.
#   bash experiments/emulated_network/network_sweep.sh [PYTHON]            # every step
#   STEPS="5" bash experiments/emulated_network/network_sweep.sh [PYTHON]  # only the steps named
set -u
PY=${1:-python}
OUT=experiments/emulated_network/rows
GLOO=experiments/gloo_pair_order/rows  # the exchange's rows: in JAX (steps 1, 9) and gloo alone
# Steps 1-4 run at the kernel's own TCP queue (4 MiB a socket); step 5 at the cluster's
# default (16 KiB).
CL="$PY -m allreduce_jax cluster --link 200Mbit --timeout 1800 --tcp-queue 4MiB"
CL16="$PY -m allreduce_jax cluster --link 200Mbit --timeout 1800 --tcp-queue 16KiB"
ALL=ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,halving_doubling_near,swing,double_binary_tree,naive,psum
FAST=ring,bidirectional_ring,halving_doubling,halving_doubling_near,swing,double_binary_tree,psum
BENCH="bench -n 3 -w 1 --no-uneven -a 3"  # -a 3: a row is the slowest process's median
mkdir -p $OUT
run() { echo "## $*" >&2; nice -n 5 "$@" 2>&1 | grep -v '^\[Gloo\]' ; }
want() { [[ " ${STEPS:-1 2 3 4 5 6} " == *" $1 "* ]]; }
# 1. the half-duplex exchange (minimal reproduction), p = 2 and 4
want 1 && {
  for h in 2 4; do
    f=$GLOO/half_duplex_p$h.jsonl
    if [ ! -s $f ]; then  # written only when the run printed its rows
      run $CL --hosts $h -- $PY experiments/gloo_pair_order/gloo_exchange_half_duplex.py > $f.tmp
      grep -q '^{' $f.tmp && grep '^{' $f.tmp > $f
      rm -f $f.tmp
    fi
  done
}
# 2. bytes on the wire, every algorithm, p = 2, 4, 8 (4 MiB per participant)
want 2 && {
  for h in 2 4 8; do
    run $CL --hosts $h -- $PY experiments/emulated_network/wire_bytes.py --bytes 4MiB --out $OUT/wire_bytes.jsonl
  done
}
# 3. time of every algorithm, 1-16 MiB (all) and 64 MiB (the fast ones), small sizes for alpha
want 3 && {
  for net in "switch 4" "switch 8" "fat_tree:4:2 8" "torus:8 8"; do
    set -- $net
    f=$OUT/bench_${1//:/_}_$2.jsonl
    run $CL --hosts $2 --topology $1 -- $BENCH --algorithms $ALL -b 4KiB -e 64KiB -f 16 --out $f
    run $CL --hosts $2 --topology $1 -- $BENCH --algorithms $ALL -b 1MiB -e 16MiB -f 4 --out $f
    run $CL --hosts $2 --topology $1 -- $BENCH --algorithms $FAST -b 64MiB -e 64MiB --out $f
  done
}
# 4. every network again in blocks (--order blocks: each algorithm's warm-up and calls
#    together), against the round robin above, where one algorithm's traffic slowed the next's
want 4 && {
  for net in "switch 4" "switch 8" "fat_tree:4:2 8" "torus:8 8"; do
    set -- $net
    run $CL --hosts $2 --topology $1 -- $BENCH --order blocks --algorithms $ALL -b 1MiB -e 16MiB \
      -f 4 --out $OUT/blocks_${1//:/_}_$2.jsonl
  done
}
# 5. every network in blocks again with 16 KiB of TCP queue a socket (cluster's default): a
#    host's "ready to receive" no longer waits behind its own bulk data; 4 and 64 KiB for α
# 6. step 5 once more, into tcp_queue_16k/repeat/: the spread from one run to the next
# 7. (only when asked: STEPS=7) step 5 with the hosts at cubic, into tcp_queue_16k/cubic/;
#    needs cubic in net.ipv4.tcp_allowed_congestion_control (cluster says so otherwise)
# 8. (only when asked: STEPS=8) step 7 again, into tcp_queue_16k/cubic_finish/: after
#    all_reduce finished each reduced slice before the all-gather, and with every row
#    recording its schedule's trace-time choices (the double binary tree's chunk count)
# 9. (only when asked: STEPS=9) one ppermute by size (64 KiB-16 MiB) on the 4-host switch at
#    cubic, 3 runs, into half_duplex_sizes_p4.jsonl (each row tagged with its run)
# 10. (only when asked: STEPS=10) step 8 once more, into tcp_queue_16k/cubic_finish/repeat/
# 12. (only when asked: STEPS=12) the ring alone at cubic on the 4-host switch, 16 MiB, 5 runs, then
#     3 runs of naive (an incast) before it on the same connections, with each host's TCP
#     retransmission counters after the run, into ring_alone_cubic/
# 11. (only when asked: STEPS=11) the same bench built as root and rootless (--rootless: in a
#     user namespace, as a user without root gets it), alternating, 3 runs each, into rootless/
# 13. (only when asked: STEPS=13) gloo alone (experiments/gloo_pair_order/exchange, built first by
#     its build.sh): one exchange with send or recv posted first, a shift, one way, and
#     halving-doubling's exchanges in both orders, on the 4-host switch without a barrier, with
#     one, and with the odd hosts 2 ms late, and on the 8-host switch without; 3 runs each, into
#     gloo_pair_order.jsonl
# 14. (only when asked: STEPS=14) the same program's ring and bidirectional ring (its lanes in
#     turn, as XLA:CPU runs them) with send or receive posted first, 4 and 8 hosts, back to back,
#     3 runs, into gloo_lanes.jsonl
small_queue() {  # DIR [CLUSTER OPTIONS...]: every network in blocks at 16 KiB, 4 KiB-64 MiB
  local dir=$1
  shift
  local CL16="$CL16 $*"
  mkdir -p $dir
  for net in "switch 4" "switch 8" "fat_tree:4:2 8" "torus:8 8"; do
    set -- $net
    f=$dir/blocks_${1//:/_}_$2.jsonl
    run $CL16 --hosts $2 --topology $1 -- $BENCH --order blocks --algorithms $ALL -b 4KiB -e 64KiB \
      -f 16 --out $f
    run $CL16 --hosts $2 --topology $1 -- $BENCH --order blocks --algorithms $ALL -b 1MiB -e 16MiB \
      -f 4 --out $f
    run $CL16 --hosts $2 --topology $1 -- $BENCH --order blocks --algorithms $FAST -b 64MiB \
      -e 64MiB --out $f
  done
}
want 5 && small_queue $OUT/tcp_queue_16k
want 6 && small_queue $OUT/tcp_queue_16k/repeat
[[ " ${STEPS:-} " == *" 7 "* ]] && small_queue $OUT/tcp_queue_16k/cubic --congestion-control cubic
[[ " ${STEPS:-} " == *" 8 "* ]] && small_queue $OUT/tcp_queue_16k/cubic_finish --congestion-control cubic
[[ " ${STEPS:-} " == *" 9 "* ]] && {
  f=$GLOO/half_duplex_sizes_p4.jsonl
  for i in 1 2 3; do
    if ! grep -q "^{\"run\": $i," $f 2>/dev/null; then
      run $CL16 --hosts 4 --congestion-control cubic -- $PY experiments/gloo_pair_order/gloo_exchange_half_duplex.py \
        --sizes 64KiB,256KiB,1MiB,4MiB,16MiB > $f.tmp
      grep '^{' $f.tmp | sed "s/^{/{\"run\": $i, \"congestion_control\": \"cubic\", /" >> $f
      rm -f $f.tmp
    fi
  done
}
[[ " ${STEPS:-} " == *" 10 "* ]] && small_queue $OUT/tcp_queue_16k/cubic_finish/repeat --congestion-control cubic
[[ " ${STEPS:-} " == *" 11 "* ]] && {
  mkdir -p $OUT/rootless
  for i in 1 2 3; do
    for mode in root rootless; do
      flag=$([ $mode = rootless ] && echo --rootless)
      run $CL16 --hosts 4 $flag -- $BENCH --order blocks --algorithms ring,halving_doubling,naive,psum \
        -b 4MiB -e 16MiB -f 4 --out $OUT/rootless/${mode}_run$i.jsonl
    done
  done
}
[[ " ${STEPS:-} " == *" 12 "* ]] && {
  d=$OUT/ring_alone_cubic
  mkdir -p $d
  counters='echo RETRANS $(hostname) $(nstat -asz TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPLossProbes | awk "NR>1{print \$1\"=\"\$2}")'
  for i in 1 2 3 4 5 6 7 8; do
    name=alone_run$i algs=ring
    [ $i -gt 5 ] && name=after_naive_run$((i - 5)) algs=naive,ring,tree
    [ -s $d/$name.jsonl ] && continue
    run $CL16 --hosts 4 --congestion-control cubic --log-dir $d/logs -- sh -c "$PY -m allreduce_jax \
      $BENCH --order blocks --algorithms $algs -b 16MiB -e 16MiB -n 5 --out $d/$name.jsonl; $counters"
    for h in 0 1 2 3; do echo "$name $(grep RETRANS $d/logs/process-$h.log)"; done >> $d/retransmissions.txt
    rm -rf $d/logs
  done
}
gloo_exchange() {  # FILE TAG HOSTS ARGS...: one run of gloo alone, its rows tagged with TAG
  local f=$1 tag=$2 h=$3 exe=experiments/gloo_pair_order/exchange store
  shift 3
  [ -x $exe ] || { echo "build $exe first (bash experiments/gloo_pair_order/build.sh)" >&2; exit 2; }
  store=$(mktemp -d /tmp/gloo-store.XXXXXX)  # gloo's FileStore rendezvous
  run $CL16 --hosts $h -- $exe --store $store "$@" --out $f.tmp
  grep '^{' $f.tmp 2>/dev/null | sed "s/^{/{$tag/" >> $f
  rm -rf $f.tmp $store
}
[[ " ${STEPS:-} " == *" 13 "* ]] && {
  f=$GLOO/gloo_pair_order.jsonl
  for h in 4 8; do
    for i in 1 2 3; do
      for mode in no_barrier barrier skew_2ms; do
        [ $h = 8 ] && [ $mode != no_barrier ] && continue  # 8 hosts: back to back only
        grep -q "^{\"run\": $i, \"mode\": \"$mode\", \"p\": $h," $f 2>/dev/null && continue
        flags=$(case $mode in no_barrier) echo --no-barrier;; barrier) echo --barrier;; *) echo --skew-ms 2;; esac)
        gloo_exchange $f "\"run\": $i, \"mode\": \"$mode\", " $h \
          --sizes 64KiB,256KiB,1MiB,4MiB,16MiB $flags
      done
    done
  done
}
[[ " ${STEPS:-} " == *" 14 "* ]] && {
  f=$GLOO/gloo_lanes.jsonl
  for h in 4 8; do
    for i in 1 2 3; do
      grep -q "^{\"run\": $i, \"p\": $h," $f 2>/dev/null && continue
      gloo_exchange $f "\"run\": $i, " $h --sizes 1MiB,4MiB,16MiB --no-barrier \
        --patterns ring,bidir_send_first,bidir_recv_first
    done
  done
}
