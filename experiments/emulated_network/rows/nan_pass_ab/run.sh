#!/bin/bash
# A/B: the ring at 64 MiB on 8 hosts, cubic, with (A) and without (B) the final canonical-NaN pass.
# Ran at commit 633d3af, when all_reduce finished the whole result on every participant
# (to repeat it: copy this script out, `git checkout 633d3af`, run the copy from the
# repository root); B edits allreduce_jax/_ops.py for its runs only.
set -u
cd "${REPO:-.}"  # run from the repository root (or set REPO)
OUT=${OUT:-/tmp/nan_pass_ab}; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
ALLOWED=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
sysctl -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED cubic" >/dev/null
trap 'git checkout allreduce_jax/_ops.py; sysctl -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED" >/dev/null' EXIT
for rep in 1 2; do for v in A B; do
  git checkout allreduce_jax/_ops.py
  if [ $v = B ]; then sed -i 's/  return _canonical_nan(total)  # the same NaN bits on every participant/  return total/' allreduce_jax/_ops.py; fi
  git diff --stat
  echo "$(date +%T) $v $rep $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" -m allreduce_jax cluster --hosts 8 --link 200Mbit --congestion-control cubic -- bench --algorithms ring,psum -b 64MiB -e 64MiB --no-uneven -n 5 -w 1 -a 3 --order blocks --out $OUT/rows_${v}_${rep}.jsonl --fresh > $OUT/log_${v}_${rep}.txt 2>&1
  python3 -c "
import json,sys
for l in open('$OUT/rows_${v}_${rep}.jsonl'):
  r=json.loads(l); print('$v $rep', r['algorithm'], r['bytes']>>20, round(r['busbw_GBps']/0.025,3), round(r['time_us']/1e6,3), round(r['time_us_min']/1e6,3), round(r['time_us_max']/1e6,3), r['wrong'])
"
done; done
