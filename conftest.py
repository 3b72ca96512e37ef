"""Test setup for tests/ and the doctests in allreduce_jax/: 8 emulated CPU devices, fixed
before any JAX backend starts."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's emulated clusters check plumbing, not time: they need not wait for a
# measuring cluster (allreduce-jax cluster --concurrent).
os.environ.setdefault("ALLREDUCE_JAX_CLUSTER_CONCURRENT", "1")

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")

# Start the backend now: a command run in-process later with --devices N < 8 would
# otherwise shrink this test worker's device count for every test after it.
jax.devices()
