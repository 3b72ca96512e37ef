"""Markdown tables drawn from result rows (never from in-memory runs)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from allreduce_jax.units import format_bytes


def _mean_std(xs: list[float]) -> str:
  a = np.asarray(xs, np.float64)
  return f"{a.mean():.4f} ± {a.std():.4f}" if a.size > 1 else f"{a.mean():.4f}"


def _group(rows: list[dict[str, Any]], *fields: str) -> dict[tuple, list[dict[str, Any]]]:
  """The rows by their values of ``fields`` (first-seen order)."""
  groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
  for r in rows:
    groups[tuple(r[f] for f in fields)].append(r)
  return groups


def _reached(xs: list, fmt: str = "{:.0f}") -> str:
  got = [x for x in xs if x is not None]
  if not got:
    return f"not reached (0/{len(xs)})"
  s = fmt.format(float(np.mean(got)))
  return s if len(got) == len(xs) else f"{s} ({len(got)}/{len(xs)})"


def staleness_table(rows: list[dict[str, Any]]) -> str:
  """Table A: per (method, τ): final test accuracy, updates to target, diverged runs.

  Example:
    >>> rows = [dict(method="sync", tau=0, final_test_acc=0.9, updates_to_target=None,
    ...              diverged=False, target=0.95)]
    >>> print(staleness_table(rows).splitlines()[2])
    | sync | 0 | 0.9000 | not reached (0/1) | 0/1 |
  """
  if not rows:
    return "(no rows)"
  groups = _group(rows, "method", "tau")
  target = rows[0]["target"]
  lines = [
    f"| method | τ | final test acc (mean ± std) | updates to {target:.0%} | diverged |",
    "|---|---|---|---|---|",
  ]
  order = {"sync": 0, "async": 1, "async_eta_tau": 2, "dcasgd": 3}
  for (method, tau), rs in sorted(
    groups.items(), key=lambda kv: (kv[0][1], order.get(kv[0][0], 9))
  ):
    lines.append(
      f"| {method} | {tau} | {_mean_std([r['final_test_acc'] for r in rs])}"
      f" | {_reached([r['updates_to_target'] for r in rs])}"
      f" | {sum(r['diverged'] for r in rs)}/{len(rs)} |"
    )
  return "\n".join(lines)


def straggler_table(rows: list[dict[str, Any]], n: int | None = None) -> str:
  """Table B: per (compute model, arm) at ``n`` workers (default: the largest N)."""
  if not rows:
    return "(no rows)"
  n = n or max(r["n"] for r in rows)
  rows = [r for r in rows if r["n"] == n]
  groups = _group(rows, "compute", "arm")
  target = rows[0]["target"]
  lines = [
    f"N = {n} workers. Time in units of one mean gradient computation.",
    "",
    f"| compute | arm | time / update | mean τ | p95 τ | dropped | final test acc"
    f" | time to {target:.0%} | × sync |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  computes = list(dict.fromkeys(r["compute"] for r in rows))
  for c in computes:
    sync_t = [r["time_to_target"] for r in groups.get((c, "sync"), [])]
    sync_t = [t for t in sync_t if t is not None]
    for arm in dict.fromkeys(r["arm"] for r in rows if r["compute"] == c):
      rs = groups[c, arm]
      ttt = [r["time_to_target"] for r in rs]
      got = [t for t in ttt if t is not None]
      rel = f"{np.mean(got) / np.mean(sync_t):.2f}" if got and sync_t else "–"
      lines.append(
        f"| {c} | {arm} | {np.mean([r['time_per_update'] for r in rs]):.3f}"
        f" | {np.mean([r['staleness_mean'] for r in rs]):.2f}"
        f" | {np.mean([r['staleness_p95'] for r in rs]):.1f}"
        f" | {np.mean([r['dropped'] for r in rs]):.0f}"
        f" | {_mean_std([r['final_test_acc'] for r in rs])}"
        f" | {_reached(ttt, '{:.1f}')} | {rel} |"
      )
  return "\n".join(lines)


def time_to_target_vs_n_table(rows: list[dict[str, Any]], compute: str = "exponential") -> str:
  """Mean simulated time to target per (N, arm) for one compute model."""
  rows = [r for r in rows if r["compute"] == compute]
  if not rows:
    return "(no rows)"
  ns = sorted({r["n"] for r in rows})
  arms = list(dict.fromkeys(r["arm"] for r in rows))
  lines = [
    f"| arm ({compute}) | " + " | ".join(f"N={n}" for n in ns) + " |",
    "|---|" + "---|" * len(ns),
  ]
  for arm in arms:
    cells = []
    for n in ns:
      ttt = [r["time_to_target"] for r in rows if r["n"] == n and r["arm"] == arm]
      cells.append(_reached(ttt, "{:.1f}") if ttt else "–")
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


# ------------------------------------------------------------------ Table C and the phase diagram


def _fmt_s(x: float) -> str:
  """Seconds with 3 significant digits (``1.23 s``, ``0.0456 s``, ``123 s``)."""
  return f"{x:.3g} s"


def setup_line(cfg) -> str:
  """One sentence naming the scenario every row of a table shares."""
  speeds = ", ".join(f"{s:g}" for s in cfg.speeds) if cfg.speeds else "all 1"
  params = f"{cfg.model_params:,} (virtual)" if cfg.model_params else "the model's real count"
  bw = f", bandwidth {cfg.bandwidth_GBps:g} GB/s" if getattr(cfg, "bandwidth_GBps", None) else ""
  compute = f"`{cfg.compute}`"
  if hasattr(cfg, "sigmas"):  # the phase diagram: σ per column, bandwidth per row
    compute, bw = "log-normal(σ per column)", ", bandwidth per row"
  return (
    f"N = {cfg.workers} workers × {cfg.batch_per_worker} samples; {cfg.gradients} per-worker"
    f" gradients per run; compute {compute} × {cfg.compute_s:g} s, speeds ({speeds});"
    f" network `{cfg.network}`{bw}; sync all-reduce `{cfg.algorithm}`; parameters priced:"
    f" {params}; parameter server: {cfg.server_shards} shard(s),"
    f" {'full' if cfg.duplex else 'half'} duplex. Times are simulated seconds, compute +"
    " communication."
  )


def table_c(rows: list[dict[str, Any]]) -> str:
  """Table C: per (workload, arm): final metric, time to target (median over seeds, in
  simulated seconds including communication, and relative to sync), updates to
  target, bytes per sample, diverged runs, mean staleness.

  Example:
    >>> r = dict(workload="w", arm="sync", metric="accuracy", target=0.9, final_metric=0.95,
    ...          time_to_target=2.0, updates_to_target=10, bytes_per_sample=100.0,
    ...          diverged=False, seed=0)
    >>> print(table_c([r]).splitlines()[2])
    | w | sync | 0.9500 | 2 s | 1.00 | 10 | 100 B | 0/1 | – |
  """
  if not rows:
    return "(no rows)"
  groups = _group(rows, "workload", "arm")
  lines = [
    "| workload | arm | final metric (mean ± std) | time to target (median) | × sync"
    " | updates to target | bytes / sample | diverged | mean τ |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for w in dict.fromkeys(r["workload"] for r in rows):
    ref = [r["time_to_target"] for r in groups.get((w, "sync"), [])]
    ref_t = float(np.median(ref)) if ref and None not in ref else None
    for arm in dict.fromkeys(r["arm"] for r in rows if r["workload"] == w):
      rs = groups[w, arm]
      ttt = [r["time_to_target"] for r in rs]
      got = [t for t in ttt if t is not None]
      if len(got) * 2 > len(rs):
        med = float(np.median([np.inf if t is None else t for t in ttt]))
        cell = _fmt_s(med) + ("" if len(got) == len(rs) else f" ({len(got)}/{len(rs)})")
        rel = f"{med / ref_t:.2f}" if ref_t else "–"
      else:
        cell, rel = f"not reached ({len(got)}/{len(rs)})", "–"
      upd = [r["updates_to_target"] for r in rs if r["updates_to_target"] is not None]
      tau = [r["staleness_mean"] for r in rs if "staleness_mean" in r]
      lines.append(
        f"| {w} | {arm} | {_mean_std([r['final_metric'] for r in rs])}"
        f" | {cell} | {rel} | {f'{np.median(upd):.0f}' if upd else '–'}"
        f" | {format_bytes(float(np.mean([r['bytes_per_sample'] for r in rs])))}"
        f" | {sum(bool(r['diverged']) for r in rs)}/{len(rs)}"
        f" | {f'{np.mean(tau):.1f}' if tau else '–'} |"
      )
  metric = {r["workload"]: (r["metric"], r["target"]) for r in rows}
  notes = "; ".join(f"{w}: test {m}, target {t:g}" for w, (m, t) in metric.items())
  return (
    "\n".join(lines)
    + f"\n\nMetric and target per workload: {notes}. Seeds per cell: "
    + (", ".join(sorted({str(len(v)) for v in groups.values()})))
  )


def phase_table(cells: list[dict[str, Any]]) -> str:
  """The phase diagram as a table: fastest arm per (bandwidth row, σ column), with
  its time to target and the fastest sync-family and PS-family times."""
  if not cells:
    return "(no cells)"
  sigmas = list(dict.fromkeys(c["sigma"] for c in cells))
  bws = sorted({c["bandwidth_GBps"] for c in cells}, reverse=True)
  lines = [
    "| bandwidth (GB/s) | all-reduce / compute | "
    + " | ".join(f"σ = {s:g}" for s in sigmas)
    + " |",
    "|---|---|" + "---|" * len(sigmas),
  ]
  for bw in bws:
    row = [c for c in cells if c["bandwidth_GBps"] == bw]
    cells_txt = []
    for s in sigmas:
      here = [c for c in row if c["sigma"] == s]
      best = min(here, key=lambda c: c["time_to_target"])
      fam = {}
      for c in here:
        fam[c["family"]] = min(fam.get(c["family"], np.inf), c["time_to_target"])
      other = " / ".join(f"{f} {_fmt_s(t)}" for f, t in sorted(fam.items()) if np.isfinite(t))
      cells_txt.append(f"**{best['winner']}** ({other})" if best["winner"] else "none")
    lines.append(f"| {bw:g} | {row[0]['ratio']:.3g} | " + " | ".join(cells_txt) + " |")
  return "\n".join(lines)


def phase_boundary(cells: list[dict[str, Any]]) -> str:
  """Per σ, which arm is fastest over which bandwidths (in GB/s and as the cost of
  one all-reduce over one mean gradient computation): the boundaries in the
  project's units."""
  lines = []
  for s in dict.fromkeys(c["sigma"] for c in cells):
    win = sorted({(c["bandwidth_GBps"], c["ratio"], c["winner"]) for c in cells if c["sigma"] == s})
    segments: list[list] = []
    for bw, ratio, arm in win:
      if segments and segments[-1][0] == arm:
        segments[-1][2], segments[-1][4] = bw, ratio
      else:
        segments.append([arm, bw, bw, ratio, ratio])
    parts = []
    for arm, lo, hi, r_lo, r_hi in segments:
      span = f"{lo:g} GB/s" if lo == hi else f"{lo:g}–{hi:g} GB/s"
      ratios = f"{r_lo:.3g}" if lo == hi else f"{r_hi:.3g}–{r_lo:.3g}"
      parts.append(f"**{arm or 'none'}** at {span} (all-reduce / compute {ratios})")
    lines.append(f"- σ = {s:g}: " + "; ".join(parts) + ".")
  return "\n".join(lines)


def compression_table(rows: list[dict[str, Any]]) -> str:
  """The compressed arms next to exact ``sync``, per workload: final metric, its
  difference from sync (paired by seed: same initial weights, data order and compute
  times), bytes per sample and how many times fewer than sync's, final training loss.

  Accuracy differences are in points (``+0.20`` = 0.2 percentage points better), loss
  differences in the metric's unit to 4 decimals (nats per byte for the LM; negative =
  better).

  Example:
    >>> r = dict(workload="w", arm="sync", metric="accuracy", final_metric=0.95,
    ...          bytes_per_sample=100.0, final_loss=0.1, diverged=False, seed=0)
    >>> c = {**r, "arm": "sync_bf16", "compression": "wire", "wire": "bf16",
    ...      "compression_algorithm": "ring", "final_metric": 0.94, "bytes_per_sample": 50.0}
    >>> print(compression_table([r, c]).splitlines()[3])
    | w | sync_bf16 | bf16 wire, ring | 0.9400 | -1.00 [-1.00, -1.00] | 50 B | 2.0× | 0.1000 | 0/1 |
  """
  if not rows:
    return "(no rows)"
  groups = _group(rows, "workload", "arm")
  lines = [
    "| workload | arm | sends | final metric (mean ± std) | Δ vs sync, paired by seed"
    " (mean [min, max]) | bytes / sample | × fewer bytes | final train loss | diverged |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for w in dict.fromkeys(r["workload"] for r in rows):
    ref = {r["seed"]: r for r in groups.get((w, "sync"), [])}
    ref_b = np.mean([r["bytes_per_sample"] for r in ref.values()]) if ref else None
    for arm in dict.fromkeys(r["arm"] for r in rows if r["workload"] == w):
      rs = groups[w, arm]
      if arm != "sync" and "compression" not in rs[0]:
        continue
      unit = 100.0 if rs[0]["metric"] == "accuracy" else 1.0
      d = [
        unit * (r["final_metric"] - ref[r["seed"]]["final_metric"]) for r in rs if r["seed"] in ref
      ]
      f = "{:+.2f}" if unit == 100.0 else "{:+.4f}"  # points; nats/byte to 4 decimals
      delta = (
        f"{f.format(np.mean(d))} [{f.format(min(d))}, {f.format(max(d))}]"
        if d and arm != "sync"
        else "–"
      )
      b = float(np.mean([r["bytes_per_sample"] for r in rs]))
      fewer = f"{ref_b / b:.1f}×" if ref_b and b else "–"
      lines.append(
        f"| {w} | {arm} | {_sends(rs[0])} | {_mean_std([r['final_metric'] for r in rs])}"
        f" | {delta} | {format_bytes(b)} | {fewer}"
        f" | {_mean_std([r['final_loss'] for r in rs])}"
        f" | {sum(bool(r['diverged']) for r in rs)}/{len(rs)} |"
      )
  return "\n".join(lines)


def _sends(row: dict[str, Any]) -> str:
  """What a Table C row's all-reduce sends, in words."""
  kind = row.get("compression")
  if kind is None:
    return "float32, exact"
  ef = "" if row.get("error_feedback") else ", no error feedback"
  if kind == "wire":
    return f"{row['wire']} wire, {row['compression_algorithm']}"
  if kind == "powersgd":
    return f"PowerSGD r = {row['rank']}{ef}"
  if kind == "topk":
    return f"top-k {row['fraction']:.0%}{ef}"
  return f"float32 through all_reduce_gradients, {row['compression_algorithm']}"
