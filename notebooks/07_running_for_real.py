# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

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

OUT = report.results_dir("notebooks", "07")

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
  f"with status {rc} instead of a hang."
)
