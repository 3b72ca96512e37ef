# %% [markdown]
# # 5 · Running for real: several processes, a real network, GPUs and TPUs
#
# Emulated devices live in one process and share its memory. The real thing is many
# processes — one per host, or one per GPU — joined into a single JAX runtime by
# `jax.distributed.initialize`: gloo over TCP between CPU processes, NCCL between GPUs,
# ICI/DCN on TPU pods. The hand-written algorithms are the same `shard_map` code either
# way. Here we write a short program that all-reduces across processes, start it as
# real processes on this machine with `allreduce-jax launch`, verify every algorithm
# across process boundaries, kill a participant on purpose, and finally time the ring on
# an emulated network of hosts with links shaped to a known rate (`allreduce-jax
# cluster`).
#
# **Run time.** Full mode takes about 3½ minutes on 2 CPU cores. Small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) takes about 2 minutes, most of it starting processes: it verifies two ops on one shape instead of every
# op and shape, and times the network at 1 MiB per host instead of 4 MiB, where a
# step's fixed costs weigh more and the measurement means less. The emulated network needs Linux
# network namespaces: as root they are made on the machine, as any other user inside a
# user namespace of your own (rootless); where neither is allowed (some containers and CI
# machines turn user namespaces off) that section says why and is skipped.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
PROCESSES = 2
LOCAL_DEVICES = 2  # emulated CPU devices per process
HOSTS = 4  # emulated hosts of the network section
LINK = "200Mbit"  # each link's rate, each way
SIZE = "1MiB" if SMALL else "4MiB"  # bytes per host in the network benchmark

# %%
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from IPython.display import display

from allreduce_jax import gloo_model, netns, units

WORK = tempfile.TemporaryDirectory(prefix="allreduce-jax-nb05-")  # removed when the kernel ends
work = Path(WORK.name)


def allreduce_jax(*args, timeout=900):
  """Runs the `allreduce-jax` command line; returns (exit status, stdout, stderr), with
  this notebook's scratch folder shown as `WORK` rather than its path on this machine."""
  res = subprocess.run(
    [sys.executable, "-m", "allreduce_jax", *map(str, args)],
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  return res.returncode, *(s.replace(str(work), "WORK") for s in (res.stdout, res.stderr))


from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")


# %% [markdown]
# ## 1 · One program, several processes
#
# Every process runs the same file. `distributed.initialize_from_env()` calls
# `jax.distributed.initialize` with what the launcher (or SLURM, or `mpirun`) put in the
# environment; after it, `jax.devices()` lists the devices of *every* process and a mesh
# can span them all. `devices.put_host` places each process's own rows on its own devices,
# and `devices.fetch` gathers a result back. The all-reduce is the one of notebook 1:

# %%
program = work / "ring_across_processes.py"
program.write_text("""
import json
import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
from allreduce_jax import all_reduce, devices, distributed

distributed.initialize_from_env()  # jax.distributed.initialize from the launcher's variables
p = jax.device_count()  # devices of every process together
mesh = jax.make_mesh((p,), ("i",))
rows = np.random.default_rng(0).integers(-8, 8, (p, 1000)).astype(np.float32)  # exact sums
x = devices.put_host(rows, NamedSharding(mesh, P("i")))  # each process places its own rows


def per_device(f):
  return jax.jit(jax.shard_map(lambda b: f(b[0])[None], mesh=mesh, in_specs=P("i"), out_specs=P("i")))


ring = devices.fetch(per_device(lambda b: all_reduce(b, "i", algorithm="ring"))(x))
psum = devices.fetch(per_device(lambda b: lax.psum(b, "i"))(x))
if jax.process_index() == 0:
  print(json.dumps({
    "processes": jax.process_count(), "devices": p, "local": jax.local_device_count(),
    "owner": [d.process_index for d in mesh.devices.flat],  # which process holds each device
    "ring_equals_psum": bool(np.array_equal(ring, psum)),
    "ring_equals_numpy": bool(np.array_equal(ring, np.broadcast_to(rows.sum(0), ring.shape))),
  }))
""")
rc, out, err = allreduce_jax(
  "launch", "-n", PROCESSES, "--local-devices", LOCAL_DEVICES, "--timeout", 300,
  "--log-dir", work / "logs", "--", sys.executable, program,
)  # fmt: skip
print(err.strip().splitlines()[0])  # the launcher's banner
assert rc == 0, err
across = json.loads(out.strip().splitlines()[-1])
across

# %% [markdown]
# The processes' devices form one mesh. Drawn as the ring runs on it: each device sends to
# the next; a hop between devices of different processes crosses a process boundary over
# gloo's TCP, the others stay inside a process, and the program never had to say which.

# %%
import matplotlib.pyplot as plt
import numpy as np

owner = across["owner"]
p = len(owner)
angle = np.pi / 2 - 2 * np.pi * np.arange(p) / p
xy = np.c_[np.cos(angle), np.sin(angle)]
colors = plt.get_cmap("tab10").colors
fig, ax = plt.subplots(figsize=(4.2, 4.2))
for i in range(p):
  j = (i + 1) % p
  crosses = owner[i] != owner[j]
  ax.annotate("", xy=0.8 * xy[j] + 0.2 * xy[i], xytext=0.8 * xy[i] + 0.2 * xy[j],
              arrowprops={"arrowstyle": "->", "lw": 2, "ls": "--" if crosses else "-",
                          "color": "black" if crosses else "grey"})  # fmt: skip
for i, (x, y) in enumerate(xy):
  ax.scatter(x, y, s=900, color=colors[owner[i]], zorder=3)
  ax.text(x, y, f"d{i}\np{owner[i]}", ha="center", va="center", fontsize=9, zorder=4)
ax.set_title(
  f"the ring on {p} devices of {max(owner) + 1} processes\n(dashed: over TCP)", fontsize=10
)
ax.set_xlim(-1.4, 1.4)
ax.set_ylim(-1.4, 1.4)
ax.set_aspect("equal")
ax.axis("off")
plt.show()
hops = sum(owner[i] != owner[(i + 1) % p] for i in range(p))
print(f"{hops} of the ring's {p} hops cross a process boundary")

# %% [markdown]
# ## 2 · Every algorithm across processes
#
# `allreduce-jax verify` under the same launcher checks every registered algorithm against
# a NumPy oracle, here with the devices spread over the processes (`hierarchical`
# runs one mesh axis per level: `inner` inside a process, `outer` across). Process 0
# writes one JSON row per case.

# %%
rows_path = work / "verify.jsonl"
verify = ["verify", "--dtypes", "float32,int32", "--kinds", "verifiable,random", "--out", rows_path]
verify += ["--shapes", "13", "--ops", "sum,max"] if SMALL else []
rc, out, err = allreduce_jax(
  "launch", "-n", PROCESSES, "--local-devices", LOCAL_DEVICES, "--timeout", 900, "--", *verify
)
print("\n".join(line for line in out.splitlines() if line.startswith("# ")))
assert rc == 0, err[-2000:]
cases = pd.read_json(rows_path, lines=True)
print(f"{int(cases['passed'].sum())} of {len(cases)} cases passed; fraction per algorithm:")
cases.pivot_table(index="algorithm", columns="dtype", values="passed", aggfunc="mean")

# %% [markdown]
# ## 3 · A participant that dies does not hang the others
#
# A known multi-host failure mode: one process dies and the others wait in the collective
# forever. The launcher watches its children; here process 1 kills itself right after
# joining, and the launcher stops the run and names it.

# %%
crash = (
  "import os, signal, time, jax\n"
  "from allreduce_jax import distributed\n"
  "distributed.initialize_from_env()\n"
  "if jax.process_index() == 1:\n"
  "  os.kill(os.getpid(), signal.SIGKILL)\n"
  "time.sleep(60)\n"
)
rc_crash, out, err = allreduce_jax(
  "launch", "-n", 2, "--timeout", 120, "--log-dir", work / "crash", "--", sys.executable, "-c", crash
)  # fmt: skip
print("exit status:", rc_crash)
print("\n".join(line for line in err.splitlines() if "launch:" in line))
named = "process 1" in err
assert rc_crash != 0 and named

# %% [markdown]
# ## 4 · A real network on this machine: `allreduce-jax cluster`
#
# Processes on one machine talk through memory copies, not a link. `cluster` builds hosts
# as Linux network namespaces, each with its own address and host name, joins them by a
# switch (a bridge) whose ports are shaped with `tc` to a known rate, and runs the same
# command on every host. Here: `bench` of the ring, halving-doubling (pairwise exchanges)
# and the parameter server (`naive`) on hosts linked at 200 Mbit/s each way, with each
# host's bytes on the wire from its interface counters.
#
# What to read: nccl-tests' **bus bandwidth**, busbw = bytes / time × 2(p−1)/p, is what
# each link carried if the algorithm were the ideal ring, so for the ring **busbw / line
# rate** is the fraction of the link the all-reduce used (1 = every link busy all the
# time). TCP over 1500-byte frames carries at most `gloo_model.payload_share()` of the line
# rate as payload: that is the ring's ceiling. On 3 or more hosts each ring step is a shift
# (every host sends to its right neighbour), so the ring can come close to it. For the
# other algorithms busbw is the same formula, a speed on the ring's scale, not their own
# link use: the parameter server's root link carries every host's buffer in and the total
# out, so it falls behind as hosts are added. Timings share the machine's CPUs with
# whatever else runs; the study `experiments/emulated_network/` measures on an idle
# machine, at every size, on three networks, with the repeats that give its spread.

# %%
why = netns.privilege_problem()
rate = units.parse_rate(LINK)  # bytes per second, each way
share = gloo_model.payload_share()
if why:
  print(f"skipped: the emulated cluster cannot be built here: {why}")
else:
  net_rows, counters = work / "cluster_bench.jsonl", work / "counters.json"
  rc, out, err = allreduce_jax(
    "cluster", "--hosts", HOSTS, "--link", LINK, "--counters", counters, "--timeout", 900,
    "--log-dir", work / "cluster_logs", *(["--concurrent"] if SMALL else []),
    "--", "bench", "--algorithms", "ring,halving_doubling,naive", "-b", SIZE, "-e", SIZE,
    "-n", 3 if SMALL else 5, "-w", 1, "--no-uneven", "--out", net_rows,
  )  # fmt: skip
  print("\n".join(line for line in err.splitlines() if line.startswith("# cluster")))
  assert rc == 0, err[-2000:]
  bench = pd.read_json(net_rows, lines=True).set_index("algorithm")
  bench["time_s"] = bench["time_us"] * 1e-6  # the slowest process's median
  bench["busbw MB/s"] = bench["busbw_gbps"] * 1e3
  bench["busbw / line rate"] = bench["busbw_gbps"] * 1e9 / rate
  print(f"{HOSTS} hosts, {SIZE} per host; line rate {rate / 1e6:g} MB/s each way, payload")
  print(f"ceiling {share:.3f} of it. Bytes each host sent and received over the whole run:")
  hosts = pd.DataFrame(json.loads(counters.read_text())["hosts"])
  print(hosts[["host", "tx_bytes", "rx_bytes"]].to_string(index=False))
  display(bench[["time_s", "busbw MB/s", "busbw / line rate"]].round(3))

# %% [markdown]
# The counters add up every algorithm's iterations; host 0, the parameter server's root,
# sends and receives more than the others.
#
# ## 5 · The same commands on a GPU cluster or a TPU pod
#
# Nothing in the library knows where it runs. On a SLURM GPU cluster, one process per GPU
# and `allreduce-jax` initializes from SLURM's variables:
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
# `docs/distributed.md` lists every variable and option. The other notebooks run
# unchanged on one GPU/TPU host: drop the `jax_num_cpu_devices` line and the mesh spans the
# real devices.
#
# ## What this run showed

# %%
CONCLUSION = {
  "processes": across["processes"],
  "devices": across["devices"],
  "ring_equals_psum": across["ring_equals_psum"],
  "crossing_hops": hops,
  "passed": int(cases["passed"].sum()),
  "cases": len(cases),
  "algorithms": cases["algorithm"].nunique(),
  "crash_named": named,
}
c = CONCLUSION
print(
  f"{c['processes']} processes joined by jax.distributed ran one mesh of {c['devices']} "
  f"devices, {c['crossing_hops']} of the ring's hops between processes: the hand-written ring "
  f"equalled lax.psum bit for bit ({c['ring_equals_psum']}), "
  f"and {c['passed']} of {c['cases']} verify cases passed over {c['algorithms']} algorithms. "
  f"A killed participant ended the run and was named ({c['crash_named']}) instead of a hang."
)
if why:
  print(
    "The emulated network could not be built on this machine (the cell above says why), "
    "so this run measured no link."
  )
else:
  ring = bench.loc["ring"]
  CONCLUSION |= {
    "hosts": HOSTS,
    "size": ring["bytes"],
    "link_MBps": rate / 1e6,
    "ring_s": ring["time_s"],
    "line_fraction": ring["busbw / line rate"],
    "ceiling": share,
    "naive_fraction": bench.loc["naive", "busbw / line rate"],
  }
  print(
    f"On {c['hosts']} emulated hosts linked at {c['link_MBps']:g} MB/s each way, the ring "
    f"all-reduced {c['size'] / 2**20:g} MiB per host in {c['ring_s']:.3f} s: busbw "
    f"{c['line_fraction']:.2f} of line rate (the payload ceiling is {c['ceiling']:.3f}); "
    f"the parameter server reached {c['naive_fraction']:.2f} on the same scale."
  )
  if SMALL:
    print(
      "Small mode times one small buffer beside whatever else runs, so its fraction of line "
      "rate is a smoke check; the full mode on an idle machine and the study are the "
      "measurements."
    )
