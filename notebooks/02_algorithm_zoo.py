# %% [markdown]
# # 2 · A zoo of all-reduce algorithms
#
# The ring moves the fewest bytes but takes 2(p−1) steps. Other algorithms trade steps
# for bytes. Here each one runs for real on emulated devices; we watch how knowledge
# spreads, count what the compiled program sends, and compare with the α-β cost table.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"
DEVICES = 8
P_TRACE = 8

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from allreduce_jax import ALGORITHMS, names, trace
from allreduce_jax.devices import factor_axes
from allreduce_jax.tools import audit, plot, verify

# Every hand-written algorithm with a cost model, from the registry records.
CUSTOM = list(names(hand_written=True, priced=True))
pd.DataFrame(
  [(a, ALGORITHMS[a].axes, ALGORITHMS[a].summary) for a in CUSTOM],
  columns=["algorithm", "mesh axes", "what it does"],
).set_index("algorithm")

# %% [markdown]
# ## Recursive doubling: lg p exchanges of everything
#
# In step k each participant swaps its **whole** partial result with the participant
# whose rank differs in bit k. After lg p steps everyone has everything: the fewest
# steps of all, but n bytes per step. MPICH uses it for messages up to 2 KiB.

# %%
trace.plot_trace(trace.run_trace("recursive_doubling", P_TRACE), f"recursive doubling, p={P_TRACE}")
plt.show()

# %% [markdown]
# ## Halving-doubling (Rabenseifner): the ring's bytes in 2 lg p steps
#
# Reduce-scatter by *recursive halving* — exchange half the range with the partner at
# distance p/2, then a quarter at p/4, ... — then all-gather by *recursive doubling*.
# Bytes sent: 2(p−1)/p·n, like the ring, in 2 lg p steps instead of 2(p−1).

# %%
trace.plot_trace(trace.run_trace("halving_doubling", P_TRACE), f"halving-doubling, p={P_TRACE}")
plt.show()

# %% [markdown]
# ## Non-power-of-two counts: MPICH's fold
#
# With p = 5, participant 0 first hands its buffer to participant 1 and sits out; the
# remaining four run the power-of-two algorithm; at the end 1 hands the result back to 0.
# Two extra steps, n extra bytes on the folded pair.

# %%
trace.plot_trace(
  trace.run_trace("halving_doubling", 5), "halving-doubling, p=5 (fold, 4 steps, unfold)"
)
plt.show()

# %% [markdown]
# ## Binomial tree, bidirectional ring, hierarchical

# %%
trace.plot_trace(
  trace.run_trace("tree", P_TRACE), f"binomial tree: reduce to 0, broadcast, p={P_TRACE}"
)
plt.show()
trace.plot_trace(
  trace.run_trace("bidirectional_ring", 4), "bidirectional ring, p=4 (two permutes per step)"
)
plt.show()
outer, inner = factor_axes(P_TRACE, 2)
trace.plot_trace(
  trace.run_trace("hierarchical", P_TRACE),
  f"hierarchical on a {outer}x{inner} mesh: ring reduce-scatter (inner), ring all-reduce (outer), all-gather (inner)",
)
plt.show()

# %% [markdown]
# ## What the compiled programs send
#
# `audit.audit_in_process` compiles each algorithm (it never runs it) and reads the
# HLO: the number of `collective-permute` ops and the bytes each participant sends.
# Every algorithm's numbers must equal the closed-form schedule of `cost_model`
# (`match`), with no XLA `all-reduce` hidden inside.

# %%
n_bytes = 4 * 16 * 3 * 5 * 7  # per participant: divisible by 2p, no padding
ps = [4, 8] if SMALL else [2, 3, 4, 5, 6, 8]
audit_rows = pd.DataFrame([r for p in ps for r in audit.audit_in_process(p, n_bytes, CUSTOM)])
assert audit_rows["match"].all() and not audit_rows["all_reduce_ops"].any()
display(audit_rows.pivot(index="algorithm", columns="p", values="permutes"))
audit_rows.pivot(index="algorithm", columns="p", values="sent_over_n").round(3)

# %% [markdown]
# Above: permutes (message steps) per algorithm and p; below it, the bytes each
# participant sends, in units of the buffer size n (a non-power-of-two p pays for the
# fold; `hierarchical` needs p to split into two factors).
#
# ## The cost table, and what it predicts
#
# With α the cost of one message step and β the cost of one byte, each schedule above
# becomes a time (`cost_model.predict_seconds`). Below: predicted time against message
# size for p = 8 with the documented default parameters (5 µs per step, 100 GB/s),
# drawn by the library's `tools.plot.model`: shaded, where the ring is latency-bound;
# dotted and numbered, the sizes where the cheapest algorithm changes (the legend names them).

# %%
plot.model(8, algorithms=CUSTOM, lo=100, hi=1e9, title="α-β model, p=8, α=5 µs, β=1/(100 GB/s)")

# %% [markdown]
# ## Every algorithm against the NumPy oracle
#
# `verify.run_case` compares each algorithm with the NumPy oracle
# (`allreduce_jax._ops.oracle`) on verifiable inputs (bit for bit), random inputs
# (within the summation bound) and special values; XLA's collectives run beside it and
# only report *backend findings* where they differ from the oracle.

# %%
rows = []
for algorithm in CUSTOM:
  rows += verify.run_case(
    algorithm, 5 if SMALL else DEVICES, dtypes=("float32", "int32"), shapes=((13,),)
  )
table = pd.DataFrame(verify.summarize(rows))
assert table["passed"].all()
table.pivot_table(index="algorithm", columns=["dtype", "op"], values="passed", aggfunc="all")

# %% [markdown]
# ## What this run showed

# %%
last = audit_rows[audit_rows["p"] == ps[-1]].set_index("algorithm")
fewest, least = last["permutes"].idxmin(), last["sent_over_n"].idxmin()
print(
  f"At p={ps[-1]}: {fewest} needs the fewest permutes ({last.loc[fewest, 'permutes']}); "
  f"{least} sends the fewest bytes per participant ({last.loc[least, 'sent_over_n']:.2f}·n). "
  f"All {len(CUSTOM)} hand-written algorithms passed {len(table)} op/dtype checks against the NumPy oracle, "
  "and every permute count and byte count matched its formula."
)
