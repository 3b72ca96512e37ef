# %% [markdown]
# # 5 · Running for real: several processes, a real network, GPUs and TPUs
#
# Emulated devices live in one process and share its memory. The real thing is many
# processes — one per host, or one per GPU — joined into a single JAX runtime by
# `jax.distributed.initialize`: gloo over TCP between CPU processes, NCCL between GPUs,
# ICI/DCN on TPU pods. The hand-written algorithms are the same `shard_map` code either
# way. Here we write a short program that all-reduces across processes, start it as
# real processes on this machine with `allreduce-jax launch`, verify every algorithm
# across process boundaries, kill a participant on purpose, time the ring on an emulated
# network of hosts with links shaped to a known rate (`allreduce-jax cluster`), and then
# **inject a fault of your own** into that network and measure what it costs. Two cells
# ask you for a number first.
#
# **Run time.** Full mode 143 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 65–145 s: most of it starting processes; it verifies two ops on one
# shape instead of every op and shape, and times the network at 1 MiB per host instead of
# 4 MiB, where a step's fixed costs weigh more (the closing cell says what that changes).
# The emulated network needs Linux network namespaces: as root they are made on the
# machine, as any other user inside a user namespace of your own (rootless); where
# neither is allowed (some containers and CI machines turn user namespaces off) those
# sections say why and are skipped.

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
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from IPython.display import display

from allreduce_jax import gloo_model, netns, teach, units

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
#
# ### Predict before you run
#
# 2 processes with 2 devices each make a ring of 4. **How many of its 4 hops cross from
# one process to the other?**

# %% tags=["predict"]
guess = None  # hops of the ring between two processes

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
teach.reveal(guess, hops, what=f"hops of the ring on {p} devices that cross a process boundary")

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
# ## 5 · Your turn: inject a fault
#
# `cluster --fault KIND:HOST...@T` changes the network while the run goes on, T seconds
# after the hosts joined: `link:H=RATE@T` sets host H's link to RATE (both directions),
# `down:H@T+D` cuts it for D seconds, `kill:H@T` and `stop:H@T` kill or freeze its
# process, `cpu:H=FRACTION@T` caps its CPU (`docs/faults.md`).
#
# ### Try this: a slow link
#
# Write the fault that slows **host 1's link to a tenth of `LINK`** from the start (rates
# are written like `LINK`: a number and `Mbit`, `Gbit`, ...). The next cells run the
# same benchmark of the ring with it.

# %% tags=["exercise"]
FAULT = None  # your --fault, as a string


# %% tags=["check"]
def fault_is_right():
  m = re.fullmatch(r"link:(\d+)=([0-9.]+\w+)@([0-9.]+)", str(FAULT))
  if m is None:
    return False, f"{FAULT!r} is not link:HOST=RATE@SECONDS"
  host, slow, at = int(m[1]), units.parse_rate(m[2]), float(m[3])
  if host != 1 or at != 0 or not np.isclose(slow, rate / 10, rtol=0.01):
    return False, f"it slows host {host} to {slow * 8 / 1e6:g} Mbit/s after {at:g} s"
  return True


teach.check(
  fault_is_right,
  right=f"host 1's link at {rate * 8 / 10 / 1e6:g} Mbit/s, a tenth of {LINK}, from the moment the hosts joined.",
  wrong=f"a link fault on host 1, at a tenth of {LINK}, at 0 seconds",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# FAULT = "link:1=20Mbit@0"  # a tenth of 200Mbit, from the start
# ```
# </details>

# %% [markdown]
# ### Predict before you run
#
# Every step of the ring moves n/p from each host to the next, all at once, and ends when
# the last message has arrived. **With host 1's link at a tenth of the rate, how many
# times its healthy time will the ring take?**

# %% tags=["predict"]
guess = None  # the ring's time with your fault / its healthy time above

# %%
slowed = None
if why:
  print(f"skipped: the emulated cluster cannot be built here: {why}")
elif FAULT is None:
  print("no fault yet: write FAULT in the exercise above, then run this cell again")
else:
  fault_rows = work / "cluster_fault.jsonl"
  rc, out, err = allreduce_jax(
    "cluster", "--hosts", HOSTS, "--link", LINK, "--fault", FAULT, "--timeout", 900,
    "--log-dir", work / "fault_logs", *(["--concurrent"] if SMALL else []),
    "--", "bench", "--algorithms", "ring", "-b", SIZE, "-e", SIZE,
    "-n", 3 if SMALL else 5, "-w", 1, "--no-uneven", "--out", fault_rows,
  )  # fmt: skip
  print("\n".join(line for line in err.splitlines() if line.startswith("# cluster: fault")))
  assert rc == 0, err[-2000:]
  slowed = pd.read_json(fault_rows, lines=True).set_index("algorithm").loc["ring", "time_us"] * 1e-6
  teach.reveal(
    guess, slowed / bench.loc["ring", "time_s"], what="the ring's time with the fault / healthy"
  )
  print(f"healthy {bench.loc['ring', 'time_s']:.3f} s, with host 1 at a tenth: {slowed:.3f} s")

# %% [markdown]
# Every step waits for the slow link, so the whole ring slows by nearly the same factor:
# an all-reduce is as fast as its slowest link (notebook 9 measures every algorithm
# against that bound, and restarts a run whose host is killed).
#
# ## 6 · The same commands on a GPU cluster or a TPU pod
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
  "lesson": {
    "one_mesh_across_processes": bool(across["ring_equals_psum"] and across["ring_equals_numpy"]),
    "every_case_passed": bool(cases["passed"].all()),
    "a_dead_participant_is_named": bool(named),
  },
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
  reason = "the emulated network could not be built on this machine"
  CONCLUSION["too_short"] = {k: reason for k in ("ring_ahead_of_the_server", "ring_near_the_ceiling", "the_fault_slows_the_ring")}  # fmt: skip
  print(f"This run measured no link: {reason} (the cells above say why).")
else:
  ring = bench.loc["ring"]
  step_s = ring["time_s"] / (2 * (HOSTS - 1))  # one of the ring's 2(p-1) steps
  wire_s = ring["bytes"] / HOSTS / (rate * share)  # its n/p bytes at the payload rate
  CONCLUSION |= {
    "hosts": HOSTS,
    "size": ring["bytes"],
    "link_MBps": rate / 1e6,
    "ring_s": ring["time_s"],
    "line_fraction": ring["busbw / line rate"],
    "ceiling": share,
    "naive_fraction": bench.loc["naive", "busbw / line rate"],
    "step_ms": 1e3 * step_s,
    "wire_ms": 1e3 * wire_s,
  }
  CONCLUSION["near"] = 0.8  # of the ceiling: "near" it
  CONCLUSION["fixed_share"] = 1 - wire_s / step_s
  claims = {
    "ring_ahead_of_the_server": bool(c["line_fraction"] > c["naive_fraction"]),
    "ring_near_the_ceiling": bool(c["line_fraction"] >= c["near"] * share),
  }
  print(
    f"On {c['hosts']} emulated hosts linked at {c['link_MBps']:g} MB/s each way, the ring "
    f"all-reduced {c['size'] / 2**20:g} MiB per host in {c['ring_s']:.3f} s: busbw "
    f"{c['line_fraction']:.2f} of line rate (the payload ceiling is {c['ceiling']:.3f}); "
    f"the parameter server reached {c['naive_fraction']:.2f} on the same scale. Each of the "
    f"ring's steps took {c['step_ms']:.1f} ms, {c['wire_ms']:.1f} ms of it its bytes on the "
    f"wire: {c['fixed_share']:.0%} of a step was fixed cost (TCP's and gloo's round trips, the "
    f"CPU the hosts share). Near the ceiling would be {c['near']:g} of it or more."
  )
  for claim, holds in claims.items():
    if holds or not SMALL:
      CONCLUSION["lesson"][claim] = holds
    else:  # a small buffer: the fixed costs, alike for every algorithm, hide the bytes
      CONCLUSION.setdefault("too_short", {})[claim] = "at this size fixed costs dominate a step"
  if CONCLUSION.get("too_short"):
    what = {"ring_ahead_of_the_server": "the ring ahead of the parameter server",
            "ring_near_the_ceiling": "the ring near the ceiling"}  # fmt: skip
    print(
      f"This small run does not show {' or '.join(what[k] for k in CONCLUSION['too_short'])}: "
      f"{next(iter(CONCLUSION['too_short'].values()))}; the full mode's larger buffer is the "
      "measurement."
    )
  if slowed is not None:
    CONCLUSION |= {"fault": FAULT, "slowdown": slowed / ring["time_s"]}
    # the fault's own numbers (host, rate, time), as the text prints them inside it
    CONCLUSION["fault_numbers"] = [float(x) for x in re.findall(r"[0-9.]+", FAULT)]
    CONCLUSION["lesson"]["the_fault_slows_the_ring"] = bool(CONCLUSION["slowdown"] > 3)
    print(
      f"With your fault ({c['fault']}) the ring took {c['slowdown']:.1f} times its healthy time."
    )
  else:
    CONCLUSION.setdefault("too_short", {})["the_fault_slows_the_ring"] = "no fault was written"
    print(f"No fault was measured: {CONCLUSION['too_short']['the_fault_slows_the_ring']}.")
