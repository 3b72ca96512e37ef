"""``auto`` fitted on the emulated network: its choice against the best measured algorithm.

    python experiments/emulated_network/auto_on_cluster.py     # every rows/**/auto_fit*.md

For each emulated network with rows in ``PREFIX_NET_HOSTS.jsonl`` (``allreduce-jax bench``
on ``allreduce-jax cluster``; ``bench_``: round robin, ``blocks_``: timed in blocks) and
each size from 1 MiB up, it fits the cost model (:func:`allreduce_jax.cost_model.fit_all`:
one α, β, γ per algorithm, what ``bench --fit`` writes) on the rows of every **other** size
from 1 MiB up (leave one size out, so the size judged is never in the fit), lets
:func:`~allreduce_jax.cost_model.choose` pick among ``auto``'s candidates measured at that
size, and divides the measured time of the pick by the fastest measured candidate's.
``algorithm="auto"`` with that fit runs exactly the picked algorithm's code, so the ratio is
what auto would have cost in that sweep. The in-sample pick (fit on every size from 1 MiB)
is shown beside it; where :data:`RUNS` names another run's folder, a fit on every size of
that run's rows of the same network picks too, judged by these rows: a fit made on the
network and used on a run it never saw.

Why not the small rows: below about 1 MiB the emulated links are faster than their rate
(each ``tbf`` bucket lets 100 KB through at once, and bench's clock on process 0 stops
when its sends are buffered): halving_doubling_near's 64 KiB row takes 2.2 ms where the
wire needs 3.9 ms. A least-squares α, β over those rows halves β (the fit on every
size picks halving_doubling_near at 16 MiB on the 4-host switch, 1.9× the ring).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import cost_model, gloo_model, results, units

MIB = 1 << 20


def _rows(path: Path) -> list[dict]:
  return results.read_rows(path, "bench")


def _sample(rows: list[dict], p: int) -> list[tuple]:
  return [(r["algorithm"], p, r["bytes"], r["time_us"] * 1e-6) for r in rows if r["bytes"] >= MIB]


def _usable(rows: list[dict]) -> list[dict]:
  return [r for r in rows if r.get("wrong") == 0 and not r.get("wire")]


def judge(rows: list[dict], p: int, other: list[dict] | None = None) -> list[dict]:
  """One row per size ≥ 1 MiB: auto's pick (left-out fit and in-sample), the best; with
  ``other`` (another run's rows of the same network), also the pick of a fit on all of
  those, judged by these rows, which that fit never saw."""
  rows = _usable(rows)
  cands = set(cost_model.auto_candidates())
  sample = _sample(rows, p)
  other_fit = cost_model.fit_all(_sample(_usable(other), p)) if other else None
  out = []
  for size in sorted({r["bytes"] for r in rows if r["bytes"] >= MIB}):
    here = {r["algorithm"]: r["time_us"] for r in rows if r["bytes"] == size}
    mine = tuple(a for a in cost_model.auto_candidates() if a in here)
    if not mine:
      continue
    best = min(mine, key=here.__getitem__)
    left_out = cost_model.fit_all([s for s in sample if s[2] != size])
    in_sample = cost_model.fit_all(sample)
    pick = cost_model.choose(p, size, left_out, candidates=mine)
    pick_in = cost_model.choose(p, size, in_sample, candidates=mine)
    out.append({
      "bytes": size, "best": best, "best_us": here[best],
      "auto": pick, "auto_us": here[pick], "ratio": here[pick] / here[best],
      "auto_in_sample": pick_in, "ratio_in_sample": here[pick_in] / here[best],
      "psum_us": here.get("psum"), "candidates": sorted(cands & set(mine)),
    })  # fmt: skip
    if other_fit is not None:
      pick_other = cost_model.choose(p, size, other_fit, candidates=mine)
      out[-1].update(auto_other_run=pick_other, ratio_other_run=here[pick_other] / here[best])
  return out


#: The tables this study commits: (folder under rows/, file prefix, the other run's folder
#: whose fit also picks, or None), as ``run.py sweep`` lays them out.
RUNS = (
  ("", "bench_", None),
  ("", "blocks_", None),
  ("tcp_queue_16k", "blocks_", "tcp_queue_16k/repeat"),
  ("tcp_queue_16k/repeat", "blocks_", "tcp_queue_16k"),
  ("tcp_queue_16k/cubic", "blocks_", "tcp_queue_16k"),
  ("tcp_queue_16k/cubic_finish", "blocks_", "tcp_queue_16k/cubic"),
  ("tcp_queue_16k/cubic_finish/repeat", "blocks_", "tcp_queue_16k/cubic_finish"),
)
HERE = Path(__file__).resolve().parent


def auto_fit(root: Path, prefix: str = "bench_", fit_root: Path | None = None, label=None):
  """``(markdown, rows)``: auto's pick against the best measured candidate for every
  network's ``PREFIX*_*.jsonl`` under ``root``; ``fit_root``: another run's folder whose
  fit on every size picks too (named ``label`` in the text, default its path)."""
  label = label or fit_root
  other_col = f" auto (fit on {label}) | ratio |" if fit_root else ""
  table, lines = [], []
  for path in sorted(root.glob(f"{prefix}*_*.jsonl")):
    net, p = path.stem.removeprefix(prefix).rsplit("_", 1)
    for kind in ("fat_tree", "torus"):  # bench_fat_tree_4_2_8 -> fat_tree:4:2, 8 hosts
      if net.startswith(kind + "_"):
        net = kind + ":" + net.removeprefix(kind + "_").replace("_", ":")
    other = _rows(fit_root / path.name) if fit_root and (fit_root / path.name).exists() else None
    rows = judge(_rows(path), int(p), other)
    if not rows:
      continue
    lines += [
      f"\n### {net}, {p} hosts\n",
      "| per participant | best measured | auto (fit without this size) | ratio |"
      " auto (fit on all sizes) | ratio |" + other_col,
      "|---|---|---|---|---|---|" + "---|---|" * bool(fit_root),
    ]
    for r in rows:
      r.update(network=net, hosts=int(p))
      table.append(r)
      lines.append(
        f"| {units.format_bytes(r['bytes'])} | {r['best']} {r['best_us'] / 1e3:.0f} ms"
        f" | {r['auto']} {r['auto_us'] / 1e3:.0f} ms | {r['ratio']:.2f}"
        f" | {r['auto_in_sample']} | {r['ratio_in_sample']:.2f} |"
        + (
          f" {r['auto_other_run']} | {r['ratio_other_run']:.2f} |" if "auto_other_run" in r else ""
        )
      )
  worst = max(table, key=lambda r: r["ratio"], default=None)
  head = f"# auto fitted on the emulated network (from the committed rows {prefix}*.jsonl)\n"
  if worst:
    ok = sum(r["ratio"] <= 1.10 for r in table)
    head += (
      f"\nauto within 1.10× of the best measured candidate in {ok} of {len(table)} cells"
      f" (fit without the judged size); worst {worst['ratio']:.2f}× ({worst['network']},"
      f" {worst['hosts']} hosts, {units.format_bytes(worst['bytes'])}: picked"
      f" {worst['auto']}, best {worst['best']}).\n"
    )
    crossed = [r for r in table if "ratio_other_run" in r]
    if crossed:
      head += (
        f"\nFitted on every size of {label} (another run) and judged by these rows: within"
        f" 1.10× in {sum(r['ratio_other_run'] <= 1.10 for r in crossed)} of {len(crossed)}"
        f" cells; worst {max(r['ratio_other_run'] for r in crossed):.2f}×.\n"
      )
  return head + "\n".join(lines) + "\n", table


def _name(prefix: str) -> str:
  return "auto_fit" if prefix == "bench_" else f"auto_fit_{prefix.rstrip('_')}"


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}`` of every committed ``auto_fit*.md``
  (:data:`RUNS`), the other run's folder named relative to ``rows/``."""
  out = {}
  with cost_model.use_params(_traced(root)):
    for folder, prefix, other in RUNS:
      fit_root = root / other if other else None
      text, _ = auto_fit(root / folder, prefix, fit_root, other)
      out[str(Path("rows") / folder / f"{_name(prefix)}.md")] = text
  return out


def _traced(root: Path):
  """The cost parameters the rows traced with (``gloo_model.traced_params``, checked): the
  fit prices each schedule as it ran (the double binary tree's chunk count)."""
  paths = sorted([*root.rglob("bench_*.jsonl"), *root.rglob("blocks_*.jsonl")])
  return gloo_model.traced_params(r for p in paths for r in _rows(p))


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
