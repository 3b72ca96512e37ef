"""Networks and the replay of an all-reduce's message steps on them, in one place.

The public face of two modules: :mod:`allreduce_jax.networks` (switch, torus, fat tree,
islands: hosts, links, routes and rates; the spec strings and their one parse table)
and :mod:`allreduce_jax.replay` (each step routed and priced; pricing and choosing an
algorithm by its replayed time), with the message generators of the original
algorithms (each defined in its algorithm's module and registered with its record).
The figures of a replay are in the tools' plot module.

Example:
  >>> from allreduce_jax import topology
  >>> r = topology.replay(topology.ring_messages((8,)), topology.torus((8,)), 1e6,
  ...                     topology.Params(1e-6, 1e-9, 0.0))
  >>> round(r.seconds * 1e6, 3)  # 14 steps of α + n/8 β
  1764.0
"""

from allreduce_jax._machine import Params
from allreduce_jax._naive import naive_messages
from allreduce_jax._recursive import halving_doubling_messages, recursive_doubling_messages
from allreduce_jax._ring import bidirectional_ring_messages, ring_messages
from allreduce_jax._tree import tree_messages
from allreduce_jax.networks import (
  SPECS,
  FatTree,
  Islands,
  Link,
  Network,
  Switch,
  Topology,
  Torus,
  even_dims,
  fat_tree,
  islands,
  parse,
  register_spec,
  switch,
  takes_link_rates,
  torus,
  with_link_rates,
)
from allreduce_jax.replay import (
  DUPLEX,
  TRACE_N,
  Message,
  Profile,
  Replay,
  Step,
  Steps,
  algorithm_profile,
  axis_sizes,
  bandwidth_term,
  candidates,
  choose,
  distinct_messages,
  half_duplex,
  messages,
  predict_seconds,
  profile,
  replay,
  step_link_loads,
  takes_size,
  trace_choices,
  traced_messages,
)

__all__ = [
  "DUPLEX",
  "SPECS",
  "TRACE_N",
  "FatTree",
  "Islands",
  "Link",
  "Message",
  "Network",
  "Params",
  "Profile",
  "Replay",
  "Step",
  "Steps",
  "Switch",
  "Topology",
  "Torus",
  "algorithm_profile",
  "axis_sizes",
  "bandwidth_term",
  "bidirectional_ring_messages",
  "candidates",
  "choose",
  "distinct_messages",
  "even_dims",
  "fat_tree",
  "half_duplex",
  "halving_doubling_messages",
  "islands",
  "messages",
  "naive_messages",
  "parse",
  "predict_seconds",
  "profile",
  "recursive_doubling_messages",
  "register_spec",
  "replay",
  "ring_messages",
  "step_link_loads",
  "switch",
  "takes_link_rates",
  "takes_size",
  "torus",
  "trace_choices",
  "traced_messages",
  "tree_messages",
  "with_link_rates",
]
