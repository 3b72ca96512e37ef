"""Rows measured on an emulated cluster, beside the model of its network.

``allreduce-jax cluster`` puts its network in every row's key (``results.run_context``:
the ``--topology`` spec, the hosts, every link's rate in bytes/s, its queue, MTU, TCP
queue, and the ``--fault`` specs it injected), so a row says which network it ran on.
Here those rows are read back and set beside the replay of that same network
(:mod:`allreduce_jax.gloo_model`): the link rate of the rows (:func:`link_rate`), the α
per step of a healthy run (:func:`healthy_alpha`), every row with a steady network next to
its replayed time and its cut bound (:func:`link_rate_cells`), and what ``auto`` picks
when told the links' rates (:func:`auto_picks`).

Which links a row's faults slowed is read with the faults' own grammar
(``tools.faults.row_links``), handed in as ``links``.

NumPy over the replay; it touches no device.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

from allreduce_jax import cost_model, gloo_model, networks, registry, results

#: A row's steady network: ``(network spec, hosts, every link's bytes/s, {host: bytes/s}
#: of the links set to another rate from the start)``, or None (another fault, or not a
#: row of an emulated cluster).
Links = tuple[str, int, float, dict[int, float]] | None


def bench_rows(path: str | os.PathLike) -> list[dict]:
  """The bench rows of ``path`` whose every element came back right (``wrong == 0``); []
  if the file does not exist."""
  return [r for r in results.read_rows(path, "bench") if r.get("wrong") == 0]


def network(row: dict) -> dict | None:
  """The emulated network ``row`` was measured on: its key's ``network`` (spec, hosts,
  ``link_Bps``, queue, MTU, TCP queue, faults), or None for a row of another machine.

  Example:
    >>> network({"key": '{"network": {"network": "switch", "hosts": 4, "link_Bps": 25e6}}'})
    {'network': 'switch', 'hosts': 4, 'link_Bps': 25000000.0}
  """
  net = json.loads(row.get("key") or "{}").get("network") or {}
  return net if "link_Bps" in net else None


def link_rate(rows: Iterable[dict]) -> float:
  """The link rate, bytes/s, every one of ``rows`` measured on an emulated cluster ran
  at (their keys' ``link_Bps``); a ``ValueError`` where they ran at several or none did.

  Example:
    >>> link_rate([{"key": '{"network": {"network": "switch", "hosts": 4, "link_Bps": 25e6}}'}])
    25000000.0
  """
  rates = {float(net["link_Bps"]) for net in map(network, rows) if net}
  if len(rates) != 1:
    raise ValueError(
      f"rows: expected rows of emulated clusters at one link rate, found {sorted(rates)}."
    )
  return rates.pop()


def line_share(row: dict) -> float:
  """A ``bench`` row's busbw over its links' rate (its key's network): how much of the
  line the all-reduce used (``1.0``: every link busy at its rate for the whole call).

  Example:
    >>> key = '{"network": {"network": "switch", "hosts": 4, "link_Bps": 25e6}}'
    >>> line_share({"key": key, "busbw_GBps": 0.0225})
    0.9
  """
  return row["busbw_GBps"] * 1e9 / network(row)["link_Bps"]


def line_shares(rows: Iterable[dict], fields: tuple[str, ...] = ("queue", "mtu")) -> dict:
  """``(hosts, *fields, algorithm, bytes) -> [line share, ...]``: :func:`line_share` of every
  right row of the ``ring`` set (``run.py link-queue``'s rows of the emulated network
  study), one per repeat, grouped by the link settings named in ``fields``.

  Example:
    >>> key = '{"network": {"network": "switch", "hosts": 4, "link_Bps": 25e6}}'
    >>> row = {"key": key, "set": "ring", "wrong": 0, "hosts": 4, "queue": "64KiB",
    ...        "algorithm": "ring", "bytes": 4, "busbw_GBps": 0.0225}
    >>> line_shares([row, {**row, "busbw_GBps": 0.02}], ("queue",))
    {(4, '64KiB', 'ring', 4): [0.9, 0.8]}
  """
  cells: dict = {}
  for r in rows:
    if r.get("set") == "ring" and r.get("wrong") == 0:
      key = (r["hosts"], *(r[f] for f in fields), r["algorithm"], r["bytes"])
      cells.setdefault(key, []).append(line_share(r))
  return cells


def seconds(rows: Iterable[dict]) -> dict[tuple[str, int], float]:
  """``(algorithm, bytes) -> seconds`` of ``bench`` rows (the last row of a cell wins).

  Example:
    >>> seconds([{"algorithm": "ring", "bytes": 4, "time_us": 2.5e6}])
    {('ring', 4): 2.5}
  """
  return {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in rows}


def runs(rows: Iterable[dict], *fields: str) -> list[dict]:
  """One cell per key (and value of each of ``fields``) over its runs, in the order first
  seen: the cell's first row with ``times_us`` (each run's ``time_us``, in order), ``runs``
  (how many) and ``time_us`` (their median).

  Example:
    >>> rows = [{"key": "a", "time_us": 3.0}, {"key": "b", "time_us": 2.0},
    ...         {"key": "a", "time_us": 1.0}]
    >>> [(c["key"], c["times_us"], c["runs"], c["time_us"]) for c in runs(rows)]
    [('a', [3.0, 1.0], 2, 2.0), ('b', [2.0], 1, 2.0)]
  """
  cells: dict[tuple, dict] = {}
  for r in rows:
    cell = cells.setdefault((r["key"], *(r.get(f) for f in fields)), {**r, "times_us": []})
    cell["times_us"].append(r["time_us"])
  for c in cells.values():
    c["runs"], c["time_us"] = len(c["times_us"]), statistics.median(c["times_us"])
  return list(cells.values())


def slowdown(row: dict, links: Callable[[dict], Links]) -> int:
  """k of a row whose faults held links at 1/k of the network's rate from the start (the
  slowest such link's k, rounded; 1: none slowed), read with ``links``
  (``tools.faults.row_links``).

  Example:
    >>> slowdown({}, lambda row: ("switch", 4, 25e6, {1: 2.5e6}))
    10
  """
  _, _, rate, slowed = links(row)
  return round(rate / min(slowed.values())) if slowed else 1


def fit_alpha(
  rows: list[dict], p: int, net: str, duplex: str = "half", bucket: bool = False
) -> float:
  """α per step that makes the replay fit ``rows`` (``bench`` rows of one network and host
  count; their 4 and 64 KiB calls, :func:`~allreduce_jax.gloo_model.fit_alpha`) at their own
  link rate; ``bucket``: with every link's token bucket priced
  (:func:`~allreduce_jax.gloo_model.link_bucket_s` of that rate)."""
  rate = link_rate(rows)
  bucket_s = gloo_model.link_bucket_s(rate) if bucket else 0.0
  return gloo_model.fit_alpha(rows, p, net, rate=rate, duplex=duplex, bucket_s=bucket_s)


def replay_cell(
  algorithm: str, p: int, n: int, net: str, measured_s: float, alpha: dict, rate: float
) -> dict:
  """One measured time beside its replay on the healthy network ``net`` at ``rate``:
  ``model_half_s`` and ``model_full_s`` (half and full duplex, with ``alpha["half"]`` and
  ``alpha["full"]``), their bounds at α = 0 (``bound_half_s``, ``bound_full_s``), with
  ``alpha["bucket"]`` also ``model_bucket_s`` (half duplex, every link's token bucket), and
  the measured busbw over the line (``busbw_over_line``)."""
  args = (algorithm, p, n, net, rate)
  cell = {
    "network": net, "p": p, "algorithm": algorithm, "bytes": n, "measured_s": measured_s,
    "model_half_s": _replay(*args, "half", alpha["half"]),
    "model_full_s": _replay(*args, "full", alpha["full"]),
    "bound_half_s": _replay(*args, "half", 0.0), "bound_full_s": _replay(*args, "full", 0.0),
    "busbw_over_line": n * 2 * (p - 1) / p / measured_s / rate, "rate": rate,
  }  # fmt: skip
  if "bucket" in alpha:
    cell["model_bucket_s"] = _replay(*args, "half", alpha["bucket"], bucket=True)
  return cell


def replay_cells(
  rows: list[dict],
  net: str,
  p: int,
  *,
  alpha_rows: list[dict] | None = None,
  bucket: bool = False,
  min_bytes: int = 1 << 20,
) -> list[dict]:
  """Every algorithm and size (from ``min_bytes``) of one network's ``bench`` rows beside
  its replay (:func:`replay_cell`), α fitted at half and full duplex (and with each link's
  token bucket, ``bucket``) on ``alpha_rows`` (default the rows themselves); algorithm by
  algorithm in the rows' order, size by size. A size measured twice takes its last row."""
  fit = alpha_rows if alpha_rows is not None else rows
  alpha = {d: fit_alpha(fit, p, net, d) for d in ("half", "full")}
  if bucket:
    alpha["bucket"] = fit_alpha(fit, p, net, "half", bucket=True)
  rate = link_rate(rows)
  t = {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in rows}
  sizes = sorted({n for _, n in t if n >= min_bytes})
  algs = dict.fromkeys(a for a, _ in t)
  return [replay_cell(a, p, n, net, t[(a, n)], alpha, rate) | {"alpha": alpha}
          for a in algs for n in sizes if (a, n) in t]  # fmt: skip


def _replay(algorithm, p, n, net, rate, duplex, alpha, bucket=False) -> float:
  bucket_s = gloo_model.link_bucket_s(rate) if bucket else 0.0
  return gloo_model.emulated_seconds(algorithm, p, n, net, rate=rate, alpha=alpha, duplex=duplex,
                                     bucket_s=bucket_s)  # fmt: skip


def healthy_alpha(rows_dir: str | os.PathLike, net: str, hosts: int) -> float:
  """α per step of a healthy run: :func:`~allreduce_jax.gloo_model.fit_alpha` on the
  ``bench`` rows (``wrong`` 0) of ``rows_dir/blocks_{net}_{hosts}.jsonl`` (``:`` as
  ``_``; calls timed in blocks, as the emulated network study writes them), else of the
  switch's with as many hosts (fitted as a switch), at the link rate the rows ran at;
  0.0 if neither file exists.

  Args:
    rows_dir: the folder of those files.
    net: the ``--topology`` spec, e.g. ``"switch"`` or ``"torus:4"``.
    hosts: the host count.
  """
  for name in (net, "switch"):
    path = Path(rows_dir) / f"blocks_{name.replace(':', '_')}_{hosts}.jsonl"
    if rows := bench_rows(path):
      return fit_alpha(rows, hosts, name)
  return 0.0


def link_rate_cells(
  rows: Iterable[dict],
  links: Callable[[dict], Links],
  alpha: Callable[[str, int], float],
  duplex: str = "half",
  buckets: bool = False,
) -> list[dict]:
  """Every ``bench`` row of ``rows`` (``wrong`` 0) with a steady emulated network beside
  its replay with those link rates (:func:`~allreduce_jax.gloo_model.emulated_seconds`)
  and the cut bound (:func:`~allreduce_jax.gloo_model.cut_bound_seconds`).

  Args:
    rows: ``bench`` rows, e.g. of ``cluster --fault link:1=20Mbit@0``.
    links: a row's steady network (:data:`Links`; ``tools.faults.row_links``).
    alpha: ``alpha(network, hosts) -> seconds per step`` (:func:`healthy_alpha`).
    duplex: as :func:`~allreduce_jax.gloo_model.emulated_seconds` takes it.
    buckets: the replay prices every link's token bucket as the cluster shapes it
      (:func:`~allreduce_jax.gloo_model.link_buckets`: a slowed link's holds 64 KiB, more
      seconds of its rate than a healthy one's 4 ms); ``alpha`` as without.

  Returns:
    One dict a row: ``algorithm, network, hosts, rate, link_rates, bytes, measured_s``,
    ``replay_s`` (None where the algorithm has no message schedule, or the network takes
    no per-host rates) and ``bound_s`` (None where the network takes no per-host rates).
  """
  out = []
  for r in rows:
    steady = links(r) if r.get("kind") == "bench" and r.get("wrong") == 0 else None
    if steady is None:
      continue
    net, p, rate, slow = steady
    alg, n = r["algorithm"], r["bytes"]
    replay_s = None
    if alg in registry.ALGORITHMS and registry.ALGORITHMS[alg].messages is not None:
      try:
        replay_s = gloo_model.emulated_seconds(alg, p, n, net, rate=rate, alpha=alpha(net, p),
                                               duplex=duplex, link_rates=slow,
                                               choices=r.get("choices"), buckets=buckets)  # fmt: skip
      except ValueError:  # a network that takes no per-host rates
        replay_s = None
    bound = None
    if takes_link_rates(net):
      bound = gloo_model.cut_bound_seconds(n, p, rate=rate, link_rates=slow, network=net)
    out.append({
      "algorithm": alg, "network": net, "hosts": p, "rate": rate, "link_rates": slow,
      "bytes": n, "measured_s": r["time_us"] * 1e-6, "replay_s": replay_s, "bound_s": bound,
    })  # fmt: skip
  return out


def takes_link_rates(net: str) -> bool:
  """Whether the emulated network ``cluster --topology net`` builds takes a rate per host
  link (:func:`allreduce_jax.networks.takes_link_rates` of :func:`gloo_model.emulated
  <allreduce_jax.gloo_model.emulated>`).

  Example:
    >>> takes_link_rates("switch"), takes_link_rates("torus:8")
    (True, True)
  """
  return networks.takes_link_rates(gloo_model.emulated(net))


def auto_picks(
  cells: list[dict], alpha: Callable[[str, int], float], duplex: str = "half", buckets: bool = False
) -> list[dict]:
  """``auto`` told the link rates, per network, host count, size and link rates of
  :func:`link_rate_cells`' ``cells``: :func:`allreduce_jax.gloo_model.choose` among the
  measured candidates of ``auto`` (:func:`~allreduce_jax.cost_model.auto_candidates`),
  priced by the replay on the network with those rates (``duplex`` as it runs; ``buckets``:
  with each link's token bucket as the cluster shapes it, as :func:`link_rate_cells`),
  against the fastest measured row (``psum`` included) and the fastest measured candidate.

  Returns:
    One dict a group: ``network, hosts, rate, link_rates, bytes, pick, pick_s, best,
    best_s, best_candidate, best_candidate_s``.
  """
  groups: dict[tuple, list[dict]] = {}
  for c in cells:
    key = (c["network"], c["hosts"], c["rate"], tuple(sorted(c["link_rates"].items())), c["bytes"])
    groups.setdefault(key, []).append(c)
  out = []
  for (net, p, rate, slow, n), group in groups.items():
    t = {c["algorithm"]: c["measured_s"] for c in group}
    cands = tuple(a for a in cost_model.auto_candidates() if a in t)
    if not cands or (slow and not takes_link_rates(net)):
      continue
    top = gloo_model.emulated_network(net, p, rate=rate, link_rates=dict(slow))
    params = gloo_model.link_params(rate, alpha(net, p))
    bucket = gloo_model.link_buckets(net, p, rate=rate, link_rates=dict(slow)) if buckets else 0.0
    pick = gloo_model.choose(p, n, params, cands, topology=top, duplex=duplex, bucket_s=bucket)
    best, best_c = min(t, key=t.get), min(cands, key=t.get)
    out.append({
      "network": net, "hosts": p, "rate": rate, "link_rates": dict(slow), "bytes": n,
      "pick": pick, "pick_s": t[pick], "best": best, "best_s": t[best],
      "best_candidate": best_c, "best_candidate_s": t[best_c],
    })  # fmt: skip
  return out
