"""Cost-model parameters shipped for XLA:CPU (``cost_model.backend_params("cpu")``).

Fitted by ``allreduce-jax bench --fit`` (the command in ``meta``) on 8 emulated XLA:CPU
devices in one process (JAX 0.10.2): the devices share the host's cores and memory, so α
and β price this emulation (thread hand-offs and memory copies), not a network. The
measured rows are ``experiments/latency_vs_bandwidth/rows/cpu_fit_bench.jsonl`` (1 KiB
to 4 MiB per participant, median of 7 timed calls each). The values depend on the CPU
that ran them: re-fit on yours with ``allreduce-jax bench --fit`` and pass the result
with ``cost_model.use_params``.
"""

CPU_FIT = {
  "meta": {
    "algorithms": [
      "bidirectional_ring",
      "halving_doubling",
      "naive",
      "psum",
      "recursive_doubling",
      "ring",
      "tree",
    ],
    "backend": "cpu",
    "command": "allreduce-jax bench --devices 8 --algorithms "
    "ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,naive,psum "
    "--min-bytes 1KiB --max-bytes 4MiB --factor 4 --iters 7 --warmup 2 --fit",
    "gamma_identified": {
      "bidirectional_ring": False,
      "halving_doubling": False,
      "naive": False,
      "psum": False,
      "recursive_doubling": False,
      "ring": False,
      "shared": True,
      "tree": False,
    },
    "jax_version": "0.10.2",
    "machine": "XLA:CPU, 8 emulated devices in one process",
    "n_devices": [8],
    "results": "experiments/latency_vs_bandwidth/rows/cpu_fit_bench.jsonl",
    "rows": 56,
    "source": "shipped CPU defaults",
  },
  "per_algorithm": {
    "bidirectional_ring": {
      "alpha_us": 326.425,
      "bandwidth_GBps": 0.106969,
      "beta_ns_per_byte": 9.34849,
      "gamma_ns_per_byte": 0.0,
    },
    "halving_doubling": {
      "alpha_us": 159.77,
      "bandwidth_GBps": 0.322973,
      "beta_ns_per_byte": 3.09623,
      "gamma_ns_per_byte": 0.0,
    },
    "naive": {
      "alpha_us": 152.64,
      "bandwidth_GBps": 0.710599,
      "beta_ns_per_byte": 1.40726,
      "gamma_ns_per_byte": 0.0,
    },
    "psum": {
      "alpha_us": 24.0008,
      "bandwidth_GBps": 0.971033,
      "beta_ns_per_byte": 1.02983,
      "gamma_ns_per_byte": 0.0,
    },
    "recursive_doubling": {
      "alpha_us": 173.909,
      "bandwidth_GBps": 0.522865,
      "beta_ns_per_byte": 1.91254,
      "gamma_ns_per_byte": 0.0,
    },
    "ring": {
      "alpha_us": 156.952,
      "bandwidth_GBps": 0.469591,
      "beta_ns_per_byte": 2.12951,
      "gamma_ns_per_byte": 0.0,
    },
    "tree": {
      "alpha_us": 167.725,
      "bandwidth_GBps": 0.769579,
      "beta_ns_per_byte": 1.29941,
      "gamma_ns_per_byte": 0.0,
    },
  },
  "shared": {
    "alpha_us": 177.346,
    "bandwidth_GBps": 1.25443,
    "beta_ns_per_byte": 0.797177,
    "gamma_ns_per_byte": 1.31709,
  },
}
