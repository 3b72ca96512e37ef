"""Gloo's exchange order: the tables of this study from its committed rows (no measurement).

    python experiments/gloo_pair_order/tables.py

Reads ``rows/`` beside this script: ``half_duplex_p*.jsonl`` and
``half_duplex_sizes_p4.jsonl`` (``gloo_exchange_half_duplex.py``: one ``ppermute`` in
JAX over gloo), ``gloo_pair_order.jsonl`` and ``gloo_lanes.jsonl`` (``exchange``: gloo
alone, no JAX); α for the replay comes from the emulated network's JAX rows of the same
network and TCP settings (``../emulated_network/rows/``). Writes ``tables.md`` beside this
script. The replay is :func:`allreduce_jax.gloo_model.emulated_seconds` and
:func:`allreduce_jax.gloo_model.steady_step_seconds`.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from allreduce_jax import cluster_rows, cost_model, gloo_model, results
from allreduce_jax.units import spread

HERE = Path(__file__).resolve().parent
NETWORK_ROWS = HERE.parent / "emulated_network" / "rows"


def _rows(path: Path) -> list[dict]:
  """The exchange's rows (gloo alone and in JAX)."""
  return results.read_rows(path, "exchange")


def _mib(n: int) -> str:
  return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def fit_alpha(rows: list[dict], p: int, net: str) -> tuple[float, float]:
  """``(α, rate)`` of the emulated network's ``rows``: their link rate (their keys') and
  the α that fits them with each link's token bucket (:func:`gloo_model.link_bucket_s`)."""
  rate = cluster_rows.link_rate(rows)
  bucket_s = gloo_model.link_bucket_s(rate)
  return gloo_model.fit_alpha(rows, p, net, rate=rate, duplex="half", bucket_s=bucket_s), rate


def model(alg: str, p: int, n: int, net: str, duplex: str, alpha: float, rate: float) -> float:
  """The replay with each link's token bucket, at the rows' ``rate``."""
  bucket_s = gloo_model.link_bucket_s(rate)
  return gloo_model.emulated_seconds(
    alg, p, n, net, rate=rate, alpha=alpha, duplex=duplex, bucket_s=bucket_s
  )


def half_duplex_table(root: Path) -> list[str]:
  lines = []
  for p in (2, 4):
    rows = _rows(root / f"half_duplex_p{p}.jsonl")
    if not rows:
      continue
    if not lines:
      lines = [
        "### One ppermute of 16 MiB per host (line rate: 0.671 s)",
        "",
        "Median of 7 calls [fastest–slowest]. The handshake: the exchange right after a"
        " 4-byte exchange between the same pairs.",
        "",
        "| p | shift j→j+1 | exchange j↔j^1 | one way j→j^1 (even j) | handshake, then exchange |",
        "|---|---|---|---|---|",
      ]
    t = {r["pattern"]: r for r in rows}

    def cell(name, t=t):
      if name not in t:
        return "—"
      r = t[name]
      spread = f" [{r['min_s']:.3f}–{r['max_s']:.3f}]" if "min_s" in r else ""
      return f"{r['median_s']:.3f} s{spread}"

    cells = " | ".join(cell(k) for k in ("shift", "exchange", "one_way", "handshake"))
    lines.append(f"| {p} | {cells} |")
  return [*lines, ""] if lines else []


def half_duplex_sizes_table(root: Path, network: Path) -> list[str]:
  """One ``ppermute`` per size on the 4-host switch (``gloo_exchange_half_duplex.py
  --sizes``, runs in ``half_duplex_sizes_p4.jsonl``): the exchange and the handshake
  against the shift of the same run, beside the replay's exchange / shift with each
  link's bucket, in the steady state of back-to-back calls (the fourth of four
  identical steps; α of the 4-host switch at ``cubic``, step 8, fitted with the bucket)."""
  rows = _rows(root / "half_duplex_sizes_p4.jsonl")
  if not rows:
    return []
  cubic = cluster_rows.bench_rows(
    network / "tcp_queue_16k" / "cubic_finish" / "blocks_switch_4.jsonl"
  )
  alpha, rate = fit_alpha(cubic, 4, "switch")

  def steady(step, n):
    return gloo_model.steady_step_seconds(
      step, 4, n, "switch", rate=rate, alpha=alpha, bucket_s=gloo_model.link_bucket_s(rate)
    )

  shift = [(j, (j + 1) % 4, 1.0) for j in range(4)]
  exchange = [(j, j ^ 1, 1.0) for j in range(4)]
  runs = sorted({r["run"] for r in rows})
  t = {(r["run"], r["bytes"], r["pattern"]): r["median_s"] for r in rows}

  lines = [
    f"### One ppermute per host, by size: exchange vs shift (4-host switch, `cubic`, {len(runs)} runs)",
    "",
    "Each run times 7 calls of each pattern after a warm-up (`python experiments/"
    "gloo_pair_order/gloo_exchange_half_duplex.py --sizes ...`); per run the median exchange / median"
    " shift, then the median over runs [min–max]. The replay: each link's 4 ms bucket,"
    f" the exchange's two directions in turn (α = {alpha * 1e3:.2f} ms, the 4-host"
    " switch's at `cubic` in step 8), its exchange / shift in the steady state of"
    " back-to-back calls.",
    "",
    "| per host | shift (s) | shift / (n at the link rate) | exchange / shift | handshake, then exchange / shift | replay: exchange / shift |",
    "|---|---|---|---|---|---|",
  ]  # fmt: skip
  for n in sorted({r["bytes"] for r in rows}):
    sh = [t[(k, n, "shift")] for k in runs]
    ex = [t[(k, n, "exchange")] / t[(k, n, "shift")] for k in runs]
    hs = [t[(k, n, "handshake")] / t[(k, n, "shift")] for k in runs]
    model = steady(exchange, n) / steady(shift, n)
    lines.append(
      f"| {_mib(n)} | {statistics.median(sh):.4g} | {statistics.median(sh) * rate / n:.2f} |"
      f" {spread(ex)} | {spread(hs)} | {model:.2f} |"
    )
  return [*lines, ""]


def gloo_pair_order_table(root: Path, network: Path) -> list[str]:
  """Gloo alone (``experiments/gloo_pair_order/exchange``, rows in
  ``gloo_pair_order.jsonl``, step 13 of ``run.py sweep``): per host count, start mode
  and size, one way's time and each pattern's time over it (per run, then the median over
  runs [min–max]). An exchange moves twice one way's bytes over the same links, so at full
  duplex it takes one way's time, at half duplex twice that. Halving-doubling's
  exchanges (n/2, n/4, ... and back: 2(p−1)/p · n each way) in either order, over
  2(p−1)/p times one way's time: 1.00 at full duplex."""
  rows = _rows(root / "gloo_pair_order.jsonl")
  if not rows:
    return []
  t = {(r["p"], r["run"], r["mode"], r["bytes"], r["pattern"]): r["median_s"] for r in rows}
  runs = sorted({r["run"] for r in rows})
  hosts = sorted({r["p"] for r in rows})
  modes = {
    "no_barrier": "back to back (no barrier, as in a compiled program)",
    "barrier": "a barrier before each call",
    "skew_2ms": "a barrier, then the odd hosts 2 ms late",
  }
  lines = [
    f"### Gloo alone: send or receive first in one exchange ({' and '.join(map(str, hosts))}"
    f"-host switch, {len(runs)} runs)",
    "",
    "`python experiments/emulated_network/run.py sweep 13` (gloo's TCP transport in C++, no JAX:"
    " `experiments/gloo_pair_order/`). Pairs j↔j^1; `send_first` posts the send, then the"
    " receive (XLA's `CollectivePermute`), `recv_first` the receive, then the send; one way:"
    " the even hosts send, the odd ones receive. Each call's time is its slowest host's;"
    " per run the median of 7 calls, each pattern over one way's time of that run, then"
    " the median over runs [min–max]. Full duplex: 1.00; half duplex: 2.00. Halving-doubling:"
    " its exchanges without the arithmetic (n/2, n/4, ... with j^1, j^2, ..., then back, one"
    " step after the other), over 2(p−1)/p × one way (its bytes each way at one way's rate).",
    "",
    "| hosts | start | per host | one way (s) | send first / one way | recv first / one way"
    " | shift / one way | halving-doubling, send first / full duplex | recv first / full duplex |",
    "|---|---|---|---|---|---|---|---|---|",
  ]  # fmt: skip
  for p in hosts:
    hd_share = 2 * (p - 1) / p  # halving-doubling's bytes each way, in units of n
    for mode, label in modes.items():
      for n in sorted({k[3] for k in t if k[0] == p and k[2] == mode}):
        have = [k for k in runs if (p, k, mode, n, "one_way") in t]
        one = [t[(p, k, mode, n, "one_way")] for k in have]

        def over(pattern, share=1.0, p=p, have=have, mode=mode, n=n):
          xs = [t[(p, k, mode, n, pattern)] / (share * t[(p, k, mode, n, "one_way")])
                for k in have if (p, k, mode, n, pattern) in t]  # fmt: skip
          return spread(xs)

        lines.append(
          f"| {p} | {label} | {_mib(n)} | {statistics.median(one):.4g} | {over('send_first')} |"
          f" {over('recv_first')} | {over('shift')} | {over('hd_send_first', hd_share)} |"
          f" {over('hd_recv_first', hd_share)} |"
        )
  replay = [line for p in hosts for line in _hd_replay_lines(network, t, runs, p)]
  return [*lines, "", *replay, ""]


def _hd_replay_lines(network: Path, t: dict, runs: list[int], p: int) -> list[str]:
  """Halving-doubling's exchanges on ``p`` hosts measured in both orders (back to back)
  against the replay as XLA runs them (``duplex="half"``) and with each receive posted
  first (``"recv_first"``), with each link's bucket and the α of the same network and TCP
  settings in JAX (the p-host switch, 16 KiB, ``bbr``: step 5), which also prices the
  arithmetic and JAX's own time per step that gloo alone does not have."""
  rows = cluster_rows.bench_rows(network / "tcp_queue_16k" / f"blocks_switch_{p}.jsonl")
  if not rows:
    return []
  alpha, rate = fit_alpha(rows, p, "switch")
  cells = []
  for n in (4 << 20, 16 << 20):
    keys = {
      o: [(p, k, "no_barrier", n, f"hd_{o}") for k in runs] for o in ("send_first", "recv_first")
    }
    if not all(key in t for ks in keys.values() for key in ks):
      continue
    measured = {o: statistics.median(t[key] for key in ks) for o, ks in keys.items()}
    half = model("halving_doubling", p, n, "switch", "half", alpha, rate)
    first = model("halving_doubling", p, n, "switch", "recv_first", alpha, rate)
    cells.append(
      f"at {_mib(n)}, send first {measured['send_first']:.3f} s (replay as XLA runs it,"
      f' `duplex="half"`: {half:.3f} s), receive first {measured["recv_first"]:.3f} s'
      f' (`duplex="recv_first"`: {first:.3f} s)'
    )
  if not cells:
    return []
  return [
    f"- {p} hosts: halving-doubling's exchanges back to back (medians over runs) against the"
    f" replay (`gloo_model.emulated_seconds`, each link's bucket, α = {alpha * 1e3:.2f} ms fitted"
    f" on the {p}-host switch's rows at 16 KiB, step 5): " + "; ".join(cells) + "."
  ]


def gloo_lanes_table(root: Path) -> list[str]:
  """The ring and the bidirectional ring in gloo alone (``gloo_lanes.jsonl``, step 14 of
  ``run.py sweep``): per host count and size, the ring's time and each bidirectional
  order's over the ring's of the same run (median over runs [min–max]), and the slowest
  call of any run over the ring's median: the bidirectional ring's calls take the ring's
  time or up to twice it, in either order."""
  rows = _rows(root / "gloo_lanes.jsonl")
  if not rows:
    return []
  t = {(r["p"], r["run"], r["bytes"], r["pattern"]): r for r in rows}
  runs = sorted({r["run"] for r in rows})
  lines = [
    f"### Gloo alone: the ring and the bidirectional ring ({len(runs)} runs)",
    "",
    "`python experiments/emulated_network/run.py sweep 14` (`experiments/gloo_pair_order/exchange"
    " --patterns ring,bidir_send_first,bidir_recv_first --no-barrier`): the ring's 2(p−1)"
    " shifts of n/p, and the bidirectional ring's lanes in turn as XLA:CPU runs them (n/2p"
    " to j+1, then n/2p to j−1, each step), with each send or each receive posted first."
    " Per run the median of 7 calls over the ring's median of that run, then the median over"
    " runs [min–max]; slowest call: the slowest call of all runs over the ring's median.",
    "",
    "| hosts | per host | ring (s) | bidirectional, send first / ring | slowest call | bidirectional, recv first / ring | slowest call |",
    "|---|---|---|---|---|---|---|",
  ]  # fmt: skip
  for p, n in sorted({(k[0], k[2]) for k in t}):
    have = [k for k in runs if (p, k, n, "ring") in t]
    ring = [t[(p, k, n, "ring")]["median_s"] for k in have]
    cells = []
    for pattern in ("bidir_send_first", "bidir_recv_first"):
      pairs = [(t[(p, k, n, pattern)], t[(p, k, n, "ring")]["median_s"]) for k in have
               if (p, k, n, pattern) in t]  # fmt: skip
      ratio = spread([r["median_s"] / base for r, base in pairs]) if pairs else "—"
      worst = max((r["max_s"] / base for r, base in pairs), default=None)
      cells += [ratio, f"{worst:.2f}" if worst is not None else "—"]
    lines.append(f"| {p} | {_mib(n)} | {spread(ring, '.3f')} | " + " | ".join(cells) + " |")
  return [*lines, ""]


def tables(root: Path = HERE / "rows", network: Path = NETWORK_ROWS) -> dict[str, str]:
  """``{file name: text}`` of this study's tables from the rows under ``root`` (α from the
  emulated network's rows under ``network``, priced with the cost parameters they traced
  with: ``gloo_model.traced_params``)."""
  paths = sorted([*network.rglob("bench_*.jsonl"), *network.rglob("blocks_*.jsonl")])
  traced = [r for path in paths for r in results.read_rows(path, "bench")]
  with cost_model.use_params(gloo_model.traced_params(traced)):
    text = ["# Gloo's exchange, in JAX and alone (tables from the committed rows)", ""]
    text += half_duplex_table(root) + half_duplex_sizes_table(root, network)
    text += gloo_pair_order_table(root, network) + gloo_lanes_table(root)
  return {"tables.md": "\n".join(text) + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
