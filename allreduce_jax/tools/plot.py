"""Every figure of the tools: each function returns a ``matplotlib.figure.Figure``.

The figures are built without ``pyplot`` and without choosing a backend, so the same
function serves a headless command (:func:`save` writes a PNG) and a notebook (show
the returned figure, e.g. as a cell's last expression or with ``display(fig)``).
Every algorithm keeps one colour, marker and line style in every figure
(:func:`allreduce_jax.palette.style`); XLA's own all-reduce (``psum``, the registry
record with ``hand_written=False``) is black, thicker and drawn on top. Legends sit
outside the axes (beside or below them), and :func:`save` keeps them in the image.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from allreduce_jax import ALGORITHMS, cost_model, devices, gloo_model, names, palette, replay
from allreduce_jax.units import format_bytes, format_rate

#: The figures and the helpers the tools and notebooks use (a public module: notebooks
#: import it, see ``tests/test_layout.py``).
__all__ = [
  "audit",
  "bench",
  "busbw",
  "byte_ticks",
  "fusion",
  "is_reference",
  "mark",
  "model",
  "network_of",
  "network_title",
  "over_flat",
  "save",
  "scaling",
  "step_loads",
  "style",
  "winners",
]


def is_reference(algorithm: str) -> bool:
  """XLA's own collective (a registry record with ``hand_written=False``): drawn black."""
  record = ALGORITHMS.get(algorithm)
  return record is not None and not record.hand_written


def _order(algorithms) -> list[str]:
  """Hand-written algorithms by name, then the reference (drawn last, on top)."""
  return sorted(set(algorithms), key=lambda a: (is_reference(a), a))


_LINESTYLES = ("-", "--", "-.", ":")


def style(algorithm: str, wire: str | None = None) -> dict:
  """:func:`allreduce_jax.palette.style` (the algorithm's colour, marker and line
  style, in every figure the same) with a line width and drawing order: the reference
  thicker and on top."""
  ref = is_reference(algorithm)
  return {**palette.style(algorithm, wire), "linewidth": 2.6 if ref else 1.4,
          "zorder": 5 if ref else 3}  # fmt: skip


def _legend_below(fig: Figure, axes, ncol: int = 4, title: str | None = None) -> None:
  """One legend for every panel (the entries of all of them, once each), centred below
  the panels: off every curve and note; :func:`save` keeps it in the image."""
  handles: dict = {}
  for ax in axes:
    for h, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, h)
  if handles:
    fig.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(ncol, len(handles)), fontsize=8, frameon=False, title=title,
               title_fontsize=8)  # fmt: skip


def mark(ax, x: float, y: float, text: str) -> None:
  """A dotted red vertical line at ``x`` labelled ``text`` (top-aligned at ``y``): where
  something changes (the model's best algorithm, the ring's crossover)."""
  ax.axvline(x, color="tab:red", ls=":", lw=1)
  lo, hi = ax.dataLim.intervalx
  # Right of the middle (log axis) the note hangs left of the line, inside the panel.
  right = x > math.sqrt(lo * hi) if lo > 0 else x > (lo + hi) / 2
  pad = (lambda line: line + " ") if right else (lambda line: " " + line)
  label = "\n".join(pad(line) for line in text.splitlines())
  # On a white box: a curve running through the note does not cross its letters.
  box = {"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1}
  ax.text(x, y, label, fontsize=7, color="tab:red", va="top", ha="right" if right else "left",
          bbox=box)  # fmt: skip


def save(fig: Figure, path, dpi: int = 120) -> Path:
  """Writes ``fig`` to ``path`` (folders created); returns the path."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  # tight: the legends placed outside the axes are part of the image, never clipped
  fig.savefig(path, dpi=dpi, bbox_inches="tight")
  return path


def byte_ticks(ax, lo: float, hi: float, base: int = 4) -> None:
  """x ticks at powers of ``base`` from ``lo`` to ``hi`` labelled 1KiB, 4KiB, ... 16MiB."""
  k0, k1 = math.floor(math.log(max(lo, 1), base)), math.ceil(math.log(max(hi, 1), base))
  ticks = [float(base) ** k for k in range(k0, k1 + 1)]
  ax.set_xticks(ticks, [format_bytes(t) for t in ticks], fontsize=8)
  ax.minorticks_off()


def _groups(algs: Sequence[str], p: int) -> list[tuple[str, list[str]]]:
  """Algorithms split by their step count at ``p``: O(p) steps (the ring family) and
  O(log p) steps (trees, doubling, halving); the reference goes in every group."""

  ref = [a for a in algs if is_reference(a)]
  linear, logarithmic = [], []
  for a in algs:
    if a in ref:
      continue
    record = ALGORITHMS.get(a)
    steps = None
    if record is not None and record.schedule is not None:
      steps = cost_model.schedule(a, p, 1024, inner=devices.inner_size(a, p)).steps
    linear_steps = steps is not None and steps >= p - 1 and steps > 2 * math.log2(p)
    (linear if linear_steps and p > 2 else logarithmic).append(a)
  groups = [("O(p) steps: the ring family", linear), ("O(log p) steps", logarithmic)]
  return [(name, [*g, *ref]) for name, g in groups if g] or [("", ref)]


def network_of(rows: Sequence[dict]) -> dict | None:
  """The emulated network bench rows ran on (``allreduce-jax cluster``; their key's
  ``network``: ``network``, ``hosts``, ``link_Bps``, ``mtu``), None for rows of one
  process or of a network without a shaped link rate."""
  for r in rows[:1]:
    try:
      net = json.loads(r.get("key") or "{}").get("network")
    except (TypeError, ValueError, AttributeError):
      return None
    if isinstance(net, dict) and net.get("link_Bps") and net.get("network"):
      return net
  return None


def network_title(net: dict) -> str:
  """A network as a figure's title names it (``net`` as :func:`network_of` returns).

  Example:
    >>> network_title({"network": "switch", "hosts": 4, "link_Bps": 25e6})
    'switch, 4 hosts, 200 Mbit/s links'
  """
  rate = format_rate(net["link_Bps"]).split("(")[-1].rstrip(")")
  return f"{net['network']}, {net.get('hosts', '?')} hosts, {rate} links"


def _model_us(alg: str, p: int, n: float, params, net: dict | None, choices=None):
  """The model a measured line is drawn against (µs), None where it has none: on an
  emulated network the schedule replayed on its own links as XLA:CPU and gloo run it
  (``gloo_model``: one ppermute at a time, exchanges half duplex, the link rate less
  TCP/IP headers, α = 0: a bound); in one process the fitted α-β-γ model."""
  record = ALGORITHMS.get(alg)
  if record is None or record.schedule is None:
    return None
  if net is not None:
    if record.messages is None or not record.hand_written:
      return None
    link = gloo_model.link_params(net["link_Bps"], 0.0, int(net.get("mtu", 1500)))
    top = gloo_model.emulated(net["network"])
    return 1e6 * gloo_model.predict_seconds(alg, p, n, link, top, "half", choices=choices)
  return cost_model.predict_us(alg, p, n, params, inner=devices.inner_size(alg, p))


def _time_panel(ax, rows, algs, p, params, net, sizes, wire=None, modelled=True) -> None:
  """Measured time vs size (solid, bars min–max; a size that is not a multiple of p
  hollow and unconnected) and each algorithm's model dashed in its colour."""
  for alg in algs:
    mine = sorted((r for r in rows if r["algorithm"] == alg), key=lambda r: r["bytes"])
    if not mine:
      continue
    even = [r for r in mine if r.get("count", 0) % p == 0] or mine
    odd = [r for r in mine if r not in even]
    st = {**style(alg), "linestyle": "-"}
    ax.errorbar(
      [r["bytes"] for r in even],
      [r["time_us"] for r in even],
      yerr=[  # rows of older versions may hold another process's spread: clip at 0
        [max(0.0, r["time_us"] - r.get("time_us_min", r["time_us"])) for r in even],
        [max(0.0, r.get("time_us_max", r["time_us"]) - r["time_us"]) for r in even],
      ],
      ms=4,
      label=alg + (" (XLA, reference)" if is_reference(alg) else ""),
      capsize=2,
      **st,
    )
    if odd:
      ax.plot([r["bytes"] for r in odd], [r["time_us"] for r in odd], ls="none",
              marker=st["marker"], mfc="none", color=st["color"], ms=6)  # fmt: skip
    if wire is not None or not modelled:  # the model prices the exact program's bytes
      continue
    if net is not None:  # the replay at the measured sizes, with the choices each ran
      pred = [(r["bytes"], _model_us(alg, p, r["bytes"], params, net, r.get("choices")))
              for r in even]  # fmt: skip
    else:
      pred = [(n, _model_us(alg, p, n, params, None)) for n in sizes]
    pred = [(n, t) for n, t in pred if t is not None]
    if pred:
      ax.plot(*zip(*pred), ls="--", color=st["color"], alpha=0.8, lw=1)


def bench(
  rows: Sequence[dict], params=None, title: str = "", network: dict | None = None
) -> Figure | None:
  """Measured time vs size (log-log; solid lines and markers, bars min–max) with each
  algorithm's model dashed in its colour, then a bus-bandwidth panel; one legend for
  all panels. None if no row has p > 1.

  The time panels: in one process, one per group of algorithms (O(p) and O(log p)
  steps, XLA's psum in each), against the fitted α-β-γ model (``params``), the
  latency-bound region (below the ring's α/β balance point) shaded and the sizes where
  the model's pick among the drawn algorithms changes marked. Rows in several wire
  formats (``wire``): one panel per wire format, the exact program's with its model
  (no bus-bandwidth panel: a compressed wire does not send n). Rows of an emulated
  network (:func:`network_of`): the same groups against the schedule replayed on that
  network's links (``gloo_model``, ``params`` unused), titled with the network, the
  link rate drawn in the bus-bandwidth panel; ``network`` (the same fields) names it
  for rows whose key does not. Rows of several processes on an unnamed network get no
  model (an in-process fit does not price another machine). A size whose element
  count is not a multiple of p is drawn as an unconnected hollow marker."""

  rows = [r for r in rows if r["n_devices"] > 1]
  if not rows:
    return None
  p = rows[0]["n_devices"]
  net = network or network_of(rows)
  processes = int(rows[0].get("process_count") or 1)
  modelled = net is not None or processes == 1  # else the network is not known
  algs = _order(r["algorithm"] for r in rows)
  wires = list(dict.fromkeys(r.get("wire") or None for r in rows))
  lo, hi = min(r["bytes"] for r in rows), max(r["bytes"] for r in rows)
  if lo == hi:  # a single-size sweep: draw the model over a span around it
    lo, hi = lo / 2, hi * 2
  sizes = np.geomspace(lo, hi, 200)
  if len(wires) > 1:  # the exact program first, then each wire format
    wires.sort(key=lambda w: (w is not None, w or ""))
    exact_ref = [r for r in rows if is_reference(r["algorithm"]) and not r.get("wire")]
    panels = [  # XLA's exact psum drawn in every panel: the reference to beat
      ("exact (no compression)" if w is None else f"{w} on the wire",
       [r for r in rows if (r.get("wire") or None) == w] + (exact_ref if w else []), w)
      for w in wires
    ]  # fmt: skip
  else:
    panels = [(name, rows, None) for name in _groups(algs, p)]
  n_panels = len(panels) + (len(wires) == 1)
  ncols = 1 if n_panels == 1 else 2
  nrows = math.ceil(n_panels / ncols)
  fig = Figure(figsize=(5.4 * ncols, 4.0 * nrows + 0.6))
  grid = fig.subplots(nrows, ncols, squeeze=False).ravel()
  time_axes = list(grid[: len(panels)])
  for ax in time_axes[1:]:
    ax.sharey(time_axes[0])
  n_star = cost_model.balance_bytes("ring", p, params) if net is None and modelled else math.inf
  for ax, (label, panel_rows, wire) in zip(time_axes, panels):
    name, group = label if isinstance(label, tuple) else (label, algs)
    drawn = {r["algorithm"] for r in panel_rows}
    _time_panel(ax, panel_rows, [a for a in group if a in drawn], p, params, net, sizes, wire,
                modelled)  # fmt: skip
    if math.isfinite(n_star) and wire is None:
      ax.axvspan(sizes[0], max(min(n_star, sizes[-1]), sizes[0]), color="0.92", zorder=0)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    byte_ticks(ax, lo, hi)
    ax.set_xlabel("bytes per participant")
    ax.set_ylabel("time (µs)")
    ax.set_title(name, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
  if net is None and modelled:  # where the fitted model's pick among the drawn changes
    drawn = tuple(a for a in cost_model.auto_candidates() if a in algs)
    if len(drawn) > 1:
      top = max(r["time_us"] for r in rows)
      for n, before, after in cost_model.switch_points(p, params, sizes[0], sizes[-1], drawn):
        mark(time_axes[0], n, top, f"{before}→{after}\n{format_bytes(n)}")
  if len(wires) == 1:
    bw = grid[len(panels)]
    for alg in algs:
      mine = sorted(
        (r for r in rows if r["algorithm"] == alg and r.get("count", 0) % p == 0),
        key=lambda r: r["bytes"],
      )
      bw.plot([r["bytes"] for r in mine], [r["busbw_GBps"] for r in mine], ms=4,
              **{**style(alg), "linestyle": "-"})  # fmt: skip
    if net is not None:
      rate = net["link_Bps"] / 1e9
      bw.axhline(rate, color="0.4", ls=":", lw=1)
      bw.text(lo, rate, " link rate", fontsize=7, color="0.3", va="bottom")
      bw.set_ylim(0, rate * 1.15)
    bw.set_xscale("log", base=2)
    byte_ticks(bw, lo, hi)
    bw.set_xlabel("bytes per participant")
    bw.set_ylabel("bus bandwidth (GB/s)")
    bw.set_title("bus bandwidth = n/t · 2(p−1)/p (nccl-tests' busbw)", fontsize=10)
    bw.grid(True, which="major", alpha=0.3)
  for ax in grid[n_panels:]:
    ax.set_axis_off()
  model = (
    "replayed on the network's links (gloo_model, α = 0)"
    if net is not None
    else "fitted α-β-γ model" + (", exact program only" if len(wires) > 1 else "")
  )
  key = "solid: measured median (bars: min–max)" + (f"; dashed: {model}" if modelled else "")
  if any(r.get("count", 0) % p for r in rows):  # the unconnected hollow markers
    key += "; hollow: a size not a multiple of p (padded)"
  if len(grid) > n_panels:  # the spare panel holds the legend, in the figure's order
    seen: dict = {}
    for ax in time_axes:
      for h, label in zip(*ax.get_legend_handles_labels()):
        seen.setdefault(label, h)
    rank = {a: k for k, a in enumerate(algs)}
    seen = dict(sorted(seen.items(), key=lambda kv: rank.get(kv[0].split(" ")[0], len(rank))))
    spare = grid[n_panels]
    spare.legend(seen.values(), seen.keys(), loc="center", fontsize=8, frameon=False,
                 ncol=2 if len(seen) > 8 else 1, title=key.replace("; ", "\n"),
                 title_fontsize=8)  # fmt: skip
  if net is not None:
    where = network_title(net) + f" ({processes} processes, gloo)"
  elif processes > 1:
    where = f"{processes} processes over gloo ({p} devices)"
  else:
    where = f"{p} {rows[0].get('backend', '')} devices in one process".replace("  ", " ")
  shaded = "; shaded: latency-bound" if math.isfinite(n_star) else ""
  fig.suptitle(title or f"all-reduce on {where}{shaded}", fontsize=11)
  fig.tight_layout()
  if len(grid) == n_panels:
    _legend_below(fig, time_axes, ncol=4, title=key)
  return fig


def fusion(rows: Sequence[dict], buckets: Sequence[str] | None = None) -> Figure:
  """Speedup over per-leaf vs bucket size, one line per (model, algorithm)."""
  fig = Figure(figsize=(8, 5))
  ax = fig.subplots()
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["model"], r["algorithm"], r["n_leaves"]), []).append(r)
  order = list(buckets or dict.fromkeys(r["bucket"] for r in rows))
  models = sorted({g[0] for g in groups})
  for (model, alg, leaves), rs in groups.items():
    rs = sorted(rs, key=lambda r: order.index(r["bucket"]) if r["bucket"] in order else 99)
    st = style(alg)  # the algorithm's colour and marker; the line style: the model
    st["linestyle"] = _LINESTYLES[models.index(model) % len(_LINESTYLES)]
    ax.plot(
      [r["bucket"] for r in rs],
      [r["speedup_vs_per_leaf"] for r in rs],
      label=f"{model} ({leaves} leaves), {alg}",
      **st,
    )
  ax.axhline(1.0, color="0.5", lw=0.8)
  ax.set_yscale("log")
  ax.set_xlabel("bucket size (per-leaf = no fusion; one = one bucket per dtype)")
  ax.set_ylabel("speedup over per-leaf all-reduce (median times)")
  if rows:
    ax.set_title(f"tensor fusion on {rows[0]['n_devices']} {rows[0]['backend']} devices")
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
  ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  return fig


def audit(rows: Sequence[dict]) -> Figure:
  """Left: max bytes sent per participant / n vs p, from compiled HLO. Right: compile
  time vs p. One marker and line style per algorithm, so lines that coincide (every
  bandwidth-optimal algorithm sends 2(p-1)/p·n) stay distinguishable."""
  fig = Figure(figsize=(11, 4.5))
  ax1, ax2 = fig.subplots(1, 2)
  algs = list(dict.fromkeys(r["algorithm"] for r in rows))
  for k, alg in enumerate(algs):
    rs = sorted((r for r in rows if r["algorithm"] == alg), key=lambda r: r["p"])
    ps = [r["p"] for r in rs]
    st = style(alg)
    ms = 9 - 1.2 * (k % 4)  # overlapping markers: larger ones drawn behind smaller ones
    ax1.plot(ps, [r["sent_over_n"] for r in rs], ms=ms, mfc="none", label=alg, **st)
    ax2.plot(ps, [r["compile_s"] for r in rs], ms=ms, mfc="none", label=alg, **st)
  ax1.axhline(2.0, color="0.5", ls="--", lw=0.8)
  # at the panel's left edge (axes x, data y): inside it whatever the smallest p
  ax1.text(0.02, 2.05, "2n (ring's limit)", fontsize=7, color="0.4",
           transform=ax1.get_yaxis_transform())  # fmt: skip
  for ax, ylabel in ((ax1, "max bytes sent per participant / n (from HLO)"), (ax2, "compile (s)")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("participants p")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
  ax1.set_yscale("log")
  ax1.set_title("bytes each participant sends")
  ax2.set_title("compile time (no execution)")
  fig.tight_layout()
  _legend_below(fig, [ax1], ncol=5)
  return fig


def scaling(rows: Sequence[dict], crossovers: Sequence[dict] = ()) -> Figure:
  """Predicted time vs p, one panel per (scenario, size), the ring's crossover marked
  (``crossovers``: ``tools.scaling.crossovers(rows)``)."""
  scenarios = sorted({r["scenario"] for r in rows})
  sizes = sorted({r["bytes"] for r in rows})
  fig = Figure(figsize=(5 * len(sizes), 4 * len(scenarios)))
  axes = fig.subplots(len(scenarios), len(sizes), squeeze=False)
  cross = {(c["scenario"], c["bytes"]): c for c in crossovers}
  for si, sc in enumerate(scenarios):
    for ni, n in enumerate(sizes):
      ax = axes[si][ni]
      mine = [r for r in rows if r["scenario"] == sc and r["bytes"] == n]
      for a in dict.fromkeys(r["algorithm"] for r in mine):
        rs = sorted((r for r in mine if r["algorithm"] == a), key=lambda r: r["p"])
        ax.plot(
          [r["p"] for r in rs],
          [r["predicted_us"] for r in rs],
          ms=3,
          label=a,
          **style(a),
        )
      c = cross.get((sc, n))
      if c and c["ring_loses_at"]:
        text = (
          f"ring loses at p={c['ring_loses_at']}\nto {c['winner_there']};"
          f"\n{c['ring_over_best_at_max_p']:.1f}x slower at p={c['max_p']}"
        )
        mark(ax, c["ring_loses_at"], max(r["predicted_us"] for r in mine), text)
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_title(f"{sc}: {format_bytes(n)} per device", fontsize=9)
      ax.set_xlabel("participants p")
      ax.set_ylabel("predicted time (µs)")
      ax.grid(True, which="both", alpha=0.3)
  # One legend for every panel (the same algorithms), below them: inside a panel it
  # covered curves, and the crossover notes sit at the top.
  fig.tight_layout()
  _legend_below(fig, axes.flat, ncol=5)
  return fig


def busbw(rows: Sequence[dict], title: str = "") -> Figure:
  """Bus bandwidth (nccl-tests' busbw = algbw·2(p-1)/p) vs size per algorithm: the
  number to compare with a link's peak bandwidth."""
  rows = [r for r in rows if r["n_devices"] > 1]
  fig = Figure(figsize=(7, 4.5))
  ax = fig.subplots()
  algs = _order(r["algorithm"] for r in rows)
  for alg in algs:
    mine = sorted((r for r in rows if r["algorithm"] == alg), key=lambda r: r["bytes"])
    ax.plot(
      [r["bytes"] for r in mine],
      [r["busbw_GBps"] for r in mine],
      ms=4,
      label=alg + (" (XLA, reference)" if is_reference(alg) else ""),
      **style(alg),
    )
  ax.set_xscale("log", base=2)
  if rows:
    byte_ticks(ax, min(r["bytes"] for r in rows), max(r["bytes"] for r in rows))
  ax.set_xlabel("bytes per participant")
  ax.set_ylabel("bus bandwidth (GB/s), median time")
  if rows:
    p = rows[0]["n_devices"]
    ax.set_title(title or f"bus bandwidth on {p} {rows[0].get('backend', '')} devices".strip())
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
  fig.tight_layout()
  return fig


def model(
  p: int,
  params=None,
  algorithms: Sequence[str] | None = None,
  lo: float = 8,
  hi: float = 1 << 30,
  title: str = "",
) -> Figure:
  """Predicted time vs size for ``algorithms`` (default: every priced hand-written
  one) at ``p`` participants, with the ring's latency-bound region shaded and the
  sizes where the cheapest algorithm changes marked."""

  algorithms = list(algorithms or names(hand_written=True, priced=True))
  sizes = np.geomspace(lo, hi, 200)
  fig = Figure(figsize=(9.5, 4.5))
  ax = fig.subplots()
  for alg in algorithms:
    inner = devices.inner_size(alg, p)
    t = [cost_model.predict_us(alg, p, n, params, inner=inner) for n in sizes]
    ax.plot(sizes, t, label=alg, **{**style(alg), "marker": None})
  ring_star = cost_model.balance_bytes("ring", p, params)
  if math.isfinite(ring_star):
    ax.axvspan(lo, min(ring_star, hi), color="0.92", zorder=0, label="ring latency-bound")
  # Where the cheapest algorithm changes: a numbered dotted line, its text in the legend
  # (labels beside the lines overlap when two changes are close on the log axis).
  one_axis = [a for a in algorithms if devices.inner_size(a, p) is None]
  for k, (n, before, after) in enumerate(cost_model.switch_points(p, params, lo, hi, one_axis), 1):
    ax.axvline(n, color="tab:red", ls=":", lw=1,
               label=f"({k}) best: {before} → {after} at {format_bytes(n)}")  # fmt: skip
    ax.annotate(f"({k})", (n, 1 - 0.06 * (k - 1)), xycoords=("data", "axes fraction"),
                xytext=(2, -2), textcoords="offset points", fontsize=7, color="tab:red",
                va="top")  # fmt: skip
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  byte_ticks(ax, lo, hi, base=16)
  ax.set_xlim(lo, hi)  # after the ticks, which extend the limits to whole powers
  ax.set_xlabel("bytes per participant")
  ax.set_ylabel("predicted time (µs)")
  ax.set_title(title or f"α-β-γ model, p={p}")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
  fig.tight_layout()
  return fig


# ------------------------------------------------------------------ the topology replay


def step_loads(steps: dict, network, title: str = "") -> Figure:
  """One panel per schedule: the load of every directed link in one step (bars, units
  of n per capacity; link classes side by side). ``steps``: name -> one step. Returns
  the Figure: where a step's messages pile up (the middle of a ring for far partners)."""
  fig = Figure(figsize=(9, 1.0 + 1.3 * len(steps)))
  axes = fig.subplots(len(steps), 1, squeeze=False, sharex=True)[:, 0]
  for ax, (name, step) in zip(axes, steps.items()):
    loads = replay.step_link_loads(step, network)
    x0 = 0
    for cls, v in loads.items():
      v = np.ravel(v)
      ax.bar(np.arange(x0, x0 + len(v)), v, width=0.9, label=cls)
      x0 += len(v) + 1
    peak = max(float(np.max(v)) for v in loads.values())
    ax.set_title(f"{name}: busiest link carries {peak:.3g} n", fontsize=8, loc="left")
    ax.set_ylabel("load (× n)", fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
  axes[0].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
  axes[-1].set_xlabel("directed link (grouped by class)")
  fig.suptitle(title or f"link loads of one step on {network.name}", fontsize=10)
  fig.tight_layout()
  return fig


def winners(rows: Sequence[dict]) -> Figure:
  """Where each algorithm wins: one panel per scenario (topology), participants on x,
  size on y, the fastest algorithm's name in each cell (rows of
  ``tools.scaling.sweep_topology``). Returns the Figure."""
  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  algs = list(dict.fromkeys(r["algorithm"] for r in rows))
  fig = Figure(figsize=(5.2 * len(scenarios), 3.2))
  axes = fig.subplots(1, len(scenarios), squeeze=False)[0]
  cmap = ListedColormap([style(a)["color"] for a in algs])  # each cell its winner's colour
  for ax, sc in zip(axes, scenarios):
    mine = [r for r in rows if r["scenario"] == sc]
    ps = sorted({r["p"] for r in mine})
    sizes = sorted({r["bytes"] for r in mine})
    grid = np.full((len(sizes), len(ps)), np.nan)
    for r in mine:
      if r["algorithm"] == r["best"]:
        i, j = sizes.index(r["bytes"]), ps.index(r["p"])
        grid[i, j] = algs.index(r["best"])
        short = r["best"].replace("halving_doubling", "hd").replace("double_binary_tree", "dbt")
        ax.text(j, i, short.replace("_", "\n"), ha="center", va="center", fontsize=5.5)
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(algs) - 0.5, aspect="auto", alpha=0.45,
              origin="lower", interpolation="nearest")  # fmt: skip
    ax.set_xticks(range(len(ps)), [str(p) for p in ps], fontsize=6, rotation=90)
    ax.set_yticks(range(len(sizes)), [format_bytes(n) for n in sizes], fontsize=7)
    ax.set_xlabel("participants p")
    ax.set_title(f"fastest on {sc}", fontsize=9)
  axes[0].set_ylabel("bytes per participant")
  fig.tight_layout()
  return fig


def over_flat(rows: Sequence[dict], n_bytes: float) -> Figure:
  """Replayed time / flat-model time per algorithm vs p, one panel per scenario, at one
  size: how much each network slows each schedule down. Returns the Figure."""
  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  fig = Figure(figsize=(4.6 * len(scenarios), 3.4))
  axes = fig.subplots(1, len(scenarios), squeeze=False, sharey=True)[0]
  for ax, sc in zip(axes, scenarios):
    mine = [r for r in rows if r["scenario"] == sc and r["bytes"] == n_bytes]
    for a in dict.fromkeys(r["algorithm"] for r in mine):
      rs = sorted((r for r in mine if r["algorithm"] == a), key=lambda r: r["p"])
      ax.plot([r["p"] for r in rs], [r["over_flat"] for r in rs], ms=3, label=a, **style(a))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"{sc}, {format_bytes(n_bytes)} per participant", fontsize=9)
    ax.set_xlabel("participants p")
    ax.grid(True, which="both", alpha=0.3)
  axes[0].set_ylabel("replayed time / flat α-β time")
  fig.tight_layout()
  _legend_below(fig, axes, ncol=5)
  return fig
