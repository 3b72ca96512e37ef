"""grids.md from rows/: every emulated network's cells, algorithm by size, against the
replay (no measurement here).

    python experiments/emulated_network/grids.py

Round robin (``bench_NET_HOSTS.jsonl``), in blocks (``blocks_NET_HOSTS.jsonl``) against the
round robin, and each set of :data:`SETS` against the one it repeats; each cell its seconds
and its measured / replayed time (``cluster_rows.replay_cells``: the half-duplex replay at
the rows' own link rate, α fitted on the 4 and 64 KiB rows).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import cluster_rows, cost_model, gloo_model, results, units

HERE = Path(__file__).resolve().parent
NETS = (("switch", 4), ("switch", 8), ("fat_tree:4:2", 8), ("torus:8", 8))


def _name(net: str, p: int) -> str:
  return f"{net.replace(':', '_')}_{p}.jsonl"


def grid(title: str, caption: str, rows: list[dict], text: dict) -> list[str]:
  """A markdown table of the rows' algorithms × sizes ≥ 1 MiB, ``text[(a, n)]`` in each
  cell it holds."""
  sizes = sorted({r["bytes"] for r in rows if r["bytes"] >= 1 << 20})
  algs = list(dict.fromkeys(r["algorithm"] for r in rows))
  mib = [units.format_bytes(n) for n in sizes]
  head = ["| algorithm | " + " | ".join(mib) + " |", "|---|" + "---|" * len(sizes)]
  cells = [f"| {a} | " + " | ".join(text.get((a, n), "—") for n in sizes) + " |" for a in algs]
  return [title, "", caption, "", *head, *cells, ""]


def _key(c: dict) -> tuple[str, int]:
  return c["algorithm"], c["bytes"]


def round_robin(root: Path) -> list[str]:
  """Every network round robin: measured / model at half and [at full] duplex, and the
  half-duplex model's pick among the measured hand-written algorithms against the best."""
  lines = []
  for net, p in NETS:
    rows = cluster_rows.bench_rows(root / f"bench_{_name(net, p)}")
    if not rows:
      continue
    cells = cluster_rows.replay_cells(rows, net, p)
    alpha = cells[0]["alpha"]
    text = {_key(c): f"{c['measured_s']:.3g} s ({c['measured_s'] / c['model_half_s']:.2f})"
                     f" [{c['measured_s'] / c['model_full_s']:.2f}]" for c in cells}  # fmt: skip
    lines += grid(
      f"### {net}, {p} hosts, {cells[0]['rate'] * 8e-6:g} Mbit/s links",
      f"α fitted from 4 KiB and 64 KiB: {alpha['half'] * 1e3:.2f} ms per step (half-duplex"
      f" model), {alpha['full'] * 1e3:.2f} ms (full-duplex model). Each cell: measured seconds"
      " (median of 3), then measured / model at half duplex and [at full duplex].",
      rows, text,
    )  # fmt: skip
    lines += [f"Model's choice among the measured hand-written algorithms: {picks(cells)}.", ""]
  return lines


def picks(cells: list[dict]) -> str:
  """Per size, the half-duplex model's pick against the best measured hand-written one."""
  out = []
  for n in dict.fromkeys(c["bytes"] for c in sorted(cells, key=lambda c: c["bytes"])):
    have = [c for c in cells if c["bytes"] == n and c["algorithm"] != "psum"]
    best = min(have, key=lambda c: c["measured_s"])
    pick = min(have, key=lambda c: c["model_half_s"])
    out.append(f"{units.format_bytes(n)}: model picks {pick['algorithm']}"
               f" ({pick['measured_s'] / best['measured_s']:.2f}× the best measured,"
               f" {best['algorithm']})")  # fmt: skip
  return "; ".join(out)


def in_blocks(root: Path) -> list[str]:
  """Each network timed in blocks against its round robin (α as the round robin's)."""
  lines = []
  for net, p in NETS:
    blocks, robin = (
      cluster_rows.bench_rows(root / f"blocks_{_name(net, p)}"),
      cluster_rows.bench_rows(root / f"bench_{_name(net, p)}"),
    )
    if not blocks:
      continue
    cells = cluster_rows.replay_cells(blocks, net, p, alpha_rows=robin)
    tr = {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in robin}
    text = {_key(c): f"{c['measured_s']:.3g} s ({c['measured_s'] / c['model_half_s']:.2f})"
                     f" {_ratio(tr, c)}" for c in cells}  # fmt: skip
    lines += grid(
      f"### {net}, {p} hosts, timed in blocks (`--order blocks`) vs round robin",
      "Each cell: seconds in blocks (median of 3, the slowest process), then measured / model"
      " at half duplex, then round robin's seconds / blocks' seconds (> 1: the round robin"
      " was slower).",
      blocks, text,
    )  # fmt: skip
  return lines


def _ratio(other: dict, c: dict) -> str:
  """The other set's seconds for the cell over the cell's (— where it has none)."""
  t = other.get(_key(c))
  return f"{t / c['measured_s']:.2f}×" if t is not None else "—"


#: The sweep's sets timed in blocks at the 16 KiB TCP queue, each against another set: folder
#: under rows/ -> (the other's folder, title, what the cell's ratio is, tags of its cells).
SETS = {
  "tcp_queue_16k": ("", "in blocks with `--tcp-queue 16KiB` vs 4 MiB",
                    "the 4 MiB TCP queue's seconds / these (> 1: 16 KiB is faster)",
                    {"order": "blocks", "tcp_queue": "16KiB"}),
  "tcp_queue_16k/repeat": ("tcp_queue_16k", "in blocks with `--tcp-queue 16KiB`, run again",
                           "the first run's seconds / these (> 1: the repeat was faster)",
                           {"order": "blocks", "tcp_queue": "16KiB", "run": "repeat"}),
  "tcp_queue_16k/cubic": (
    "tcp_queue_16k", "in blocks with `--tcp-queue 16KiB`, the hosts at `--congestion-control cubic`",
    "the first run's seconds (at bbr) / these (> 1: cubic was faster)",
    {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic"}),
  "tcp_queue_16k/cubic_finish": (
    "tcp_queue_16k/cubic",
    "in blocks with `--tcp-queue 16KiB`, the hosts at `cubic`, each reduced slice finished by its owner",
    "step 7's seconds (the whole result finished after the collective) / these (> 1: faster now)",
    {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic", "finish": "per slice"}),
  "tcp_queue_16k/cubic_finish/repeat": (
    "tcp_queue_16k/cubic_finish",
    "in blocks with `--tcp-queue 16KiB`, the hosts at `cubic`, each reduced slice finished by its owner, run again",
    "step 8's seconds / these (> 1: the repeat was faster)",
    {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic", "finish": "per slice",
     "run": "repeat"}),
}  # fmt: skip


def in_sets(root: Path, folder: str) -> list[str]:
  """One set of :data:`SETS`: per cell the seconds, measured / model at half duplex (α
  fitted on the set's own 4 and 64 KiB rows), and the other set's seconds / these."""
  against, title, versus, _ = SETS[folder]
  lines = []
  for net, p in NETS:
    rows = cluster_rows.bench_rows(root / folder / f"blocks_{_name(net, p)}")
    if not rows:
      continue
    cells = cluster_rows.replay_cells(rows, net, p)
    other = cluster_rows.bench_rows(root / against / f"blocks_{_name(net, p)}")
    to = {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in other}
    text = {_key(c): f"{c['measured_s']:.3g} s ({c['measured_s'] / c['model_half_s']:.2f})"
                     f" {_ratio(to, c)}" for c in cells}  # fmt: skip
    lines += grid(
      f"### {net}, {p} hosts, {title}",
      f"α fitted from this set's 4 and 64 KiB rows: {cells[0]['alpha']['half'] * 1e3:.2f} ms per"
      " step (half duplex). Each cell: seconds (median of 3, the slowest process), then"
      f" measured / model at half duplex, then {versus}.",
      rows, text,
    )  # fmt: skip
  return lines


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  paths = sorted([*root.rglob("bench_*.jsonl"), *root.rglob("blocks_*.jsonl")])
  traced = gloo_model.traced_params(r for path in paths for r in results.read_rows(path, "bench"))
  with cost_model.use_params(traced):
    text = ["# Every cell against the replay (tables from the committed rows)", ""]
    text += round_robin(root) + in_blocks(root) + [x for f in SETS for x in in_sets(root, f)]
  return {"grids.md": "\n".join(text) + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
