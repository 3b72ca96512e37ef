# %% [markdown]
# # 7 · Running for real: several processes, GPUs and TPUs
#
# Emulated devices live in one process and share its memory. The real thing is many
# processes — one per host, or one per GPU — joined into a single JAX runtime by
# `jax.distributed.initialize`: gloo over TCP between CPU processes, NCCL between GPUs,
# ICI/DCN on TPU pods. The hand-written algorithms are the same `shard_map` code
# either way; here we start real processes on this machine with `allreduce-jax launch`
# and run the verification and a benchmark across process boundaries.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"
PROCESSES = 2
LOCAL_DEVICES = 2

# %%
import io
import sys

import pandas as pd

from allreduce_jax.tools import report
from allreduce_jax.tools.launch import launch

OUT = report.results_dir("notebooks", "05")

# %% [markdown]
# ## Every algorithm across processes
#
# `launch` starts the processes (coordinator on 127.0.0.1, a free port), sets each
# one's local device count, shows process 0's output and keeps every process's log.
# With 2 processes × 2 devices, `hierarchical` runs with one mesh axis per level:
# `inner` inside a process, `outer` across processes.

# %%
out = io.StringIO()
rows_path = OUT / "verify.jsonl"
verify_args = ["--dtypes", "float32,int32", "--kinds", "verifiable,random", "--out", str(rows_path)]
if SMALL:
  verify_args += ["--shapes", "13", "--ops", "sum,max"]
rc = launch(
  ["verify", *verify_args],
  PROCESSES,
  local_devices=LOCAL_DEVICES,
  timeout=600,
  out=out,
  err=io.StringIO(),
)
print("\n".join(line for line in out.getvalue().splitlines() if line.startswith("# ")))
assert rc == 0, f"verify across processes failed with status {rc}"
cases = pd.read_json(rows_path, lines=True)
cases.pivot_table(index="algorithm", columns="dtype", values="passed", aggfunc="mean")

# %% [markdown]
# The fraction of cases passed per algorithm and dtype (1.0: all of them), read back
# from the rows process 0 wrote.
#
# ## A participant that dies does not hang the others
#
# A known multi-host failure mode: one process dies or gets stuck and the others wait
# in the collective forever. The launcher watches its children; here process 1 kills
# itself and the launcher stops the run and names it.

# %%
err = io.StringIO()
crash = "import os, signal; from allreduce_jax import distributed; distributed.initialize_from_env(); os.kill(os.getpid(), signal.SIGKILL) if __import__('jax').process_index() == 1 else __import__('time').sleep(60)"
rc = launch([sys.executable, "-c", crash], 2, timeout=120, out=io.StringIO(), err=err)
print("exit status:", rc)
print("\n".join(line for line in err.getvalue().splitlines() if "launch:" in line))
assert rc != 0 and "process 1" in err.getvalue()

# %% [markdown]
# ## A real network on this machine: `allreduce-jax cluster`
#
# Processes on one machine talk through memory copies, not a link. `cluster` builds
# hosts as Linux network namespaces, each with its own address and host name, joins
# them by a switch (a bridge) whose ports are shaped with `tc` to a known rate, and runs
# the same command on every host. Here: 4 hosts at 200 Mbit/s (25 MB/s) each way, the
# ring against an exchange-based algorithm and the parameter server, with each host's
# bytes on the wire from its interface counters. As root the namespaces are made on the
# machine; as any other user, inside a user namespace of your own (rootless: the same
# hosts and links, gone with the run's last process). Where neither is possible (user
# namespaces turned off) the cell says why and moves on.

# %%
from allreduce_jax import gloo_model, netns, units
from allreduce_jax.tools.cluster import cluster

why = netns.privilege_problem()
HOSTS, LINK = 2 if SMALL else 4, "200Mbit"
SIZE = "1MiB" if SMALL else "4MiB"
if why:
  print(f"skipped: {why}")
else:
  net_rows = OUT / "cluster_bench.jsonl"
  counters = OUT / "cluster_counters.json"
  rc = cluster(
    ["bench", "--algorithms", "ring,halving_doubling,naive", "-b", SIZE, "-e", SIZE,
     "-n", "3", "-w", "1", "--no-uneven", "--out", str(net_rows), "--fresh"],
    HOSTS, network="switch", link=LINK, counters_path=str(counters),
    timeout=900, out=io.StringIO(), err=io.StringIO(),
  )  # fmt: skip
  assert rc == 0, f"bench on the cluster failed with status {rc}"
  rate = units.parse_rate(LINK)
  measured = pd.read_json(net_rows, lines=True)
  measured["bound_s"] = [
    gloo_model.predict_seconds(a, HOSTS, n, gloo_model.link_params(rate, 0.0),
                               gloo_model.emulated("switch"))
    for a, n in zip(measured["algorithm"], measured["bytes"])
  ]  # fmt: skip
  # Each link is a token bucket of 4 ms of its rate: what an idle link passes at once.
  measured["bucket_bound_s"] = [
    gloo_model.predict_seconds(a, HOSTS, n, gloo_model.link_params(rate, 0.0),
                               gloo_model.emulated("switch"),
                               bucket_s=gloo_model.link_bucket_s(rate))
    for a, n in zip(measured["algorithm"], measured["bytes"])
  ]  # fmt: skip
  measured["time_s"] = measured["time_us"] * 1e-6
  measured["measured / bound"] = measured["time_s"] / measured["bound_s"]
  print(pd.read_json(counters)["hosts"].apply(pd.Series)[["host", "tx_bytes", "rx_bytes"]])
  print(measured[["algorithm", "bytes", "time_s", "bound_s", "bucket_bound_s",
                  "measured / bound"]].to_string())  # fmt: skip

# %% [markdown]
# The bound is the schedule's bytes at the link's payload rate (a 1500-byte frame carries
# 1448 bytes of TCP payload: `gloo_model.payload_share`), priced as XLA:CPU and gloo run
# it. XLA:CPU runs one collective at a time, so ppermutes issued together (the
# bidirectional ring's two lanes) go in turn; and a pairwise exchange is priced at half
# duplex: over gloo, A ↔ B in one `ppermute` runs one direction after the other (XLA
# posts the send before the receive, and gloo's TCP pair queues the "ready to receive"
# behind its own payload; `experiments/gloo_exchange_half_duplex.py` is the
# reproduction, and `experiments/gloo_pair_order/` shows, with gloo alone, that posting
# the receive first makes the exchange full duplex). `bucket_bound_s` also prices each link's token bucket: `tc`'s `tbf` lets
# an idle link pass 4 ms of its rate at once. With no software time between steps (this
# bound) only the first step finds the buckets full, and the second turn of each exchange
# (its link rested while the first turn sent: a 1 MiB exchange measured 1.8× a shift, not
# 2×, `docs/results/network/half_duplex_sizes_p4.jsonl`); with the α measured between steps
# (1–2 ms, fitted from small messages), every step refills them, and on 8 hosts at 1 MiB,
# where a step's message is a few buckets long, that prices the ring a quarter faster.
# The whole sweep, every algorithm on a switch, a 2:1
# fat tree and a ring of 8 hosts, is in `docs/results/network/` with the commands that
# made it, and the replay with and without the buckets against every cell.
#
# A host's queues matter as much as its links. Each emulated port is one FIFO, so the
# cluster keeps at most 16 KiB of any one TCP socket in it (`cluster --tcp-queue`, Linux's
# TCP Small Queues). With the kernel's own 4 MiB a socket, one bulk flow fills the port's
# whole 100 ms queue and the ring's "ready to receive" waits behind it at every step: at
# 4 MiB on 4 hosts the ring measured 0.84 of line rate that way and 0.94 with 16 KiB
# (medians of 3, `docs/results/network/tcp_queue.jsonl`). So does the hosts' TCP: they run
# the machine's congestion control unless `cluster --congestion-control` says otherwise
# (the banner names it). On the machine that measured these, `bbr`, the hand-written ring
# on 8 hosts reached 0.87 of line rate at 16 MiB, and 0.94 with `cubic`, most
# distributions' default (medians of 3, `docs/results/network/congestion_control.jsonl`).

# %% [markdown]
# ## The same commands on a GPU cluster or a TPU pod
#
# Nothing in the library knows where it runs. On a SLURM GPU cluster, one process per
# GPU (or per node) and `allreduce-jax` initializes from SLURM's variables:
#
# ```bash
# srun --nodes=2 --ntasks-per-node=8 --gpus-per-task=1 allreduce-jax bench --algorithms ring,halving_doubling,psum
# ```
#
# On a Cloud TPU pod slice, the same command on every worker with auto-detection:
#
# ```bash
# gcloud compute tpus tpu-vm ssh $TPU --worker=all --command \
#   "ALLREDUCE_JAX_DISTRIBUTED=auto allreduce-jax verify"
# ```
#
# `docs/distributed.md` lists every variable and option. These notebooks run unchanged
# on one GPU/TPU host: drop the `jax_num_cpu_devices` line and the mesh spans the real
# devices.

# %% [markdown]
# ## What this run showed

# %%
print(
  f"{PROCESSES} processes × {LOCAL_DEVICES} devices joined by jax.distributed (gloo): "
  f"{int(cases['passed'].sum())} of {len(cases)} cases passed over "
  f"{cases['algorithm'].nunique()} algorithms; a killed participant ended the run "
  f"instead of a hang."
)
if not why:
  ring = measured[measured["algorithm"] == "ring"].iloc[0]
  print(
    f"On {HOSTS} emulated hosts at {LINK}: the ring took {ring['time_s']:.3f} s for "
    f"{SIZE} per host, {ring['measured / bound']:.2f}× its bound from the link rate."
  )
