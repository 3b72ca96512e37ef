"""The tools wing: the ``allreduce-jax`` subcommands and their shared harness.

Everything here sits on top of the library (``allreduce_jax``); nothing in the
library imports this package.
"""

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
  "verify": (
    "allreduce_jax.tools.verify",
    "check every algorithm against a NumPy oracle (XLA's collectives beside it)",
  ),
  "bench": ("allreduce_jax.tools.bench", "nccl-tests-style bandwidth sweep (algbw/busbw)"),
  "fusion": ("allreduce_jax.tools.fusion_bench", "per-leaf vs bucketed all-reduce of a pytree"),
  "scaling": ("allreduce_jax.tools.scaling", "predicted all-reduce time up to thousands of nodes"),
  "audit": (
    "allreduce_jax.tools.audit",
    "permutes and bytes per participant from compiled HLO vs p",
  ),
  "train": (
    "allreduce_jax.tools.train",
    "data-parallel training: sync, async, SSP, stragglers, Table C, phase diagram",
  ),
  "report": ("allreduce_jax.tools.report", "run everything and write results/report/REPORT.md"),
  "launch": ("allreduce_jax.tools.launch", "run a subcommand on n local jax.distributed processes"),
  "cluster": (
    "allreduce_jax.tools.cluster",
    "run a subcommand on an emulated cluster: hosts as namespaces, shaped links",
  ),
}

#: The public modules of the API reference (``make api``; built and link-checked by
#: ``tests/test_api_docs.py``). Underscored modules are implementation.
API_MODULES: tuple[str, ...] = (
  "allreduce_jax",
  "allreduce_jax.cost_model",
  "allreduce_jax.topology",
  "allreduce_jax.units",
  "allreduce_jax.results",
  "allreduce_jax.fusion",
  "allreduce_jax.overlap",
  "allreduce_jax.gradients",
  "allreduce_jax.compression",
  "allreduce_jax.slow_leaf",
  "allreduce_jax.distributed",
  "allreduce_jax.hlo",
  "allreduce_jax.trace",
  "allreduce_jax.training",
  "allreduce_jax.wire_error",
  "allreduce_jax.networks",
  "allreduce_jax.replay",
  "allreduce_jax.gloo_model",
  "allreduce_jax.netns",
  "allreduce_jax.palette",
  "allreduce_jax.teach",
  "allreduce_jax.cli",
)
