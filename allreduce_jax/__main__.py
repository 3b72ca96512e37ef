"""``python -m allreduce_jax`` is the ``allreduce-jax`` command."""

from allreduce_jax.cli import main

if __name__ == "__main__":
  raise SystemExit(main())
