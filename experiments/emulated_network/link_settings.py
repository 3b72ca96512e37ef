"""link_settings.md from rows/: the ring and ``psum`` against the line rate as the link's
settings change (``run.py link-queue``: its queue, the MTU, the TCP queue, the hosts'
congestion control), the ring alone after an incast, root against rootless, and the bytes
on the wire (no measurement here).

    python experiments/emulated_network/link_settings.py

One function per table; a cell is the median over repeats [min–max] of busbw over the
line rate (each row's own, its key's network).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import cluster_rows, results, units
from allreduce_jax.units import spread

HERE = Path(__file__).resolve().parent
SWEEP = "python experiments/emulated_network/run.py sweep"
LINK_QUEUE = "python experiments/emulated_network/run.py link-queue"


def _config_line(cells: dict, config: tuple, sizes=(4 << 20, 16 << 20)) -> str:
  """One table line of a configuration (hosts first): its repeats, then ring and psum at
  ``sizes`` (4 and 16 MiB), each the median over repeats [min–max]."""
  row = []
  for a in ("ring", "psum"):
    for n in sizes:
      v = cells.get((*config, a, n), [])
      row.append(spread(v))
  reps = len(cells.get((*config, "ring", 4 << 20), []))
  return "| " + " | ".join(map(str, config)) + f" | {reps} | " + " | ".join(row) + " |"


def _incast_lines(rows: list[dict], field: str, label: str, caption: str) -> list[str]:
  """The incast rows of ``run.py link-queue``: each algorithm's seconds per value
  of ``field``, one column each headed ``label value``."""
  incast = [r for r in rows if r.get("set") == "incast" and r.get("wrong") == 0]
  if not incast:
    return []
  qs = list(dict.fromkeys(r[field] for r in incast))
  lines = ["", caption, "", "| algorithm | " + " | ".join(f"{label} {q}" for q in qs) + " |",
           "|---|" + "---|" * len(qs)]  # fmt: skip
  for a in dict.fromkeys(r["algorithm"] for r in incast):
    t = {r[field]: r["time_us"] * 1e-6 for r in incast if r["algorithm"] == a}
    lines.append(f"| {a} | " + " | ".join(f"{t[q]:.2f} s" if q in t else "—" for q in qs) + " |")
  return lines


def tcp_queue_table(root: Path) -> list[str]:
  """The ring and psum against line rate with the kernel's TCP queue (4 MiB a socket)
  and 16 KiB, in one run (``run.py link-queue --tcp-queues``), and the incast."""
  rows = results.read_rows(root / "tcp_queue.jsonl", "bench")
  cells = cluster_rows.line_shares(rows, ("tcp_queue",))
  if not cells:
    return []
  lines = [
    "### The TCP queue: ring and psum busbw / line rate (switch, 200 Mbit/s, 100 ms link queue)",
    "",
    f"`{LINK_QUEUE} --queues 100ms --tcp-queues 4MiB,16KiB --order blocks"
    " --incast` (`cluster --tcp-queue T -- bench --algorithms ring,psum -b 4MiB -e 16MiB -f 4"
    " -n 5 -a 3 --order blocks`), the two settings taking turns. Each cell: the median over"
    " repeats [min–max].",
    "",
    "| hosts | TCP queue | repeats | ring 4 MiB | ring 16 MiB | psum 4 MiB | psum 16 MiB |",
    "|---|---|---|---|---|---|---|",
  ]
  for config in sorted({k[:2] for k in cells}, key=lambda k: (k[0], -units.parse_size(k[1]))):
    lines.append(_config_line(cells, config))
  lines += _incast_lines(
    rows, "tcp_queue", "TCP queue", "Where messages converge (4 MiB on 8 hosts, median of 3 calls):"
  )
  return [*lines, ""]


def mtu_table(root: Path) -> list[str]:
  """The ring and psum against line rate at MTU 1500 and 9000, both with the cluster's
  16 KiB TCP queue (``mtu_16k.jsonl``, ``run.py link-queue --mtus 1500,9000
  --tcp-queues 16KiB``). Line rate counts frames: 1500 carries at most 0.956 of it as
  TCP payload, 9000 0.993 (``gloo_model.payload_share``)."""
  cells = cluster_rows.line_shares(results.read_rows(root / "mtu_16k.jsonl", "bench"), ("mtu",))
  if not cells:
    return []
  return [
    "### Jumbo frames at `--tcp-queue 16KiB`: ring and psum busbw / line rate (switch, 200 Mbit/s)",
    "",
    f"`{LINK_QUEUE} --hosts 4,8 --queues 100ms --mtus 1500,9000"
    " --tcp-queues 16KiB --order blocks --repeats 3` (`cluster --mtu M -- bench --algorithms"
    " ring,psum -b 4MiB -e 16MiB -f 4 -n 5 -a 3 --order blocks`), the MTUs taking turns. Each"
    " cell: the median over repeats [min–max]; the payload ceiling is 0.956 at MTU 1500, 0.993"
    " at 9000.",
    "",
    "| hosts | MTU | repeats | ring 4 MiB | ring 16 MiB | psum 4 MiB | psum 16 MiB |",
    "|---|---|---|---|---|---|---|",
    *(_config_line(cells, c) for c in sorted({k[:2] for k in cells})),
    "",
  ]


#: The rows measured per congestion control, and what changed in between: before and
#: after ``all_reduce`` finished each reduced slice instead of the whole result.
CC_SETS = (
  ("congestion_control.jsonl", "the whole result finished on every participant", "",
   "--hosts 8 (then --hosts 4) --congestion-controls bbr,cubic", ""),
  ("finish_per_slice.jsonl", "each reduced slice finished by its owner", ", finish per slice",
   "--hosts 8,4 --congestion-controls cubic,bbr --repeats 2",
   " Then the same with `--hosts 4 --congestion-controls cubic --repeats 4`: two more runs"
   " at 4 hosts and cubic."),
)  # fmt: skip


def congestion_control_table(root: Path) -> list[str]:
  """The ring and psum against line rate with the hosts' TCP congestion control chosen
  (``run.py link-queue --congestion-controls``), at MTU 1500 and the 16 KiB TCP
  queue, 4 to 64 MiB: ``congestion_control.jsonl``, then ``finish_per_slice.jsonl``
  (the same runs after ``all_reduce`` finished each reduced slice, ``_comm.finished``)."""
  sizes = (4 << 20, 16 << 20, 64 << 20)
  head = " | ".join(f"{a} {units.format_bytes(n)}" for a in ("ring", "psum") for n in sizes)
  lines = []
  for name, what, _, args, then in CC_SETS:
    cells = cluster_rows.line_shares(
      results.read_rows(root / name, "bench"), ("congestion_control",)
    )
    if not cells:
      continue
    lines += [
      f"### The hosts' TCP congestion control, {what}: ring and psum busbw / line rate"
      " (switch, 200 Mbit/s)",
      "",
      f"`{LINK_QUEUE} {args} --queues 100ms --tcp-queues 16KiB"
      f" --max-bytes 64MiB --order blocks --out experiments/emulated_network/rows/{name}`"
      " (`cluster --congestion-control C -- bench --algorithms ring,psum -b 4MiB -e 64MiB -f 4"
      " -n 5 -a 3 --order blocks`), the two taking turns; bbr was the hosts' default, which"
      f" every other table here ran with.{then} Each cell: the median over repeats [min–max].",
      "",
      f"| hosts | congestion control | repeats | {head} |",
      "|---|---|---|" + "---|" * len(head.split(" | ")),
      *(_config_line(cells, c, sizes) for c in sorted({k[:2] for k in cells})),
      "",
    ]
  return lines


def queue_table(root: Path) -> list[str]:
  """The ring and psum against line rate as the links' queue and MTU change
  (``run.py link-queue``), and what a short queue costs at an incast."""
  rows = results.read_rows(root / "link_queue.jsonl", "bench")
  cells = cluster_rows.line_shares(rows)
  if not cells:
    return []
  lines = [
    "### The links' queue and MTU: ring and psum busbw / line rate (switch, 200 Mbit/s)",
    "",
    f"`{LINK_QUEUE}` (`cluster --queue Q --mtu M -- bench --algorithms"
    " ring,psum -b 4MiB -e 16MiB -f 4 -n 5 -a 3`). Each cell: the median over repeats"
    " [min–max], the slowest process's time (`-a 3`).",
    "",
    "| hosts | queue | MTU | repeats | ring 4 MiB | ring 16 MiB | psum 4 MiB | psum 16 MiB |",
    "|---|---|---|---|---|---|---|---|",
  ]
  configs = sorted({k[:3] for k in cells}, key=lambda k: (k[0], k[2], float(k[1][:-2])))
  lines += [_config_line(cells, config) for config in configs]
  lines += _incast_lines(
    rows, "queue", "queue",
    "Where messages converge on one port a short queue drops packets (incast): 4 MiB on 8"
    " hosts, the slowest process's median of 3 calls:",
  )  # fmt: skip
  return [*lines, ""]


def ring_alone_table(root: Path) -> list[str]:
  """The ring alone at ``cubic`` (4-host switch, 16 MiB; ``ring_alone_cubic/``, step 12 of
  ``run.py sweep``), and after ``naive``'s incast on the same connections: busbw /
  line rate per run (median of its calls [slowest–fastest call]) and the TCP segments the
  hosts retransmitted (``retransmissions.txt``)."""
  d = root / "ring_alone_cubic"
  files = sorted(d.glob("*_run*.jsonl"))
  if not files:
    return []
  retrans: dict[str, int] = {}
  for line in (d / "retransmissions.txt").read_text().splitlines():
    run, counts = line.split()[0], dict(f.split("=") for f in line.split()[3:])
    retrans[run] = retrans.get(run, 0) + int(counts.get("TcpRetransSegs", 0))
  lines = [
    "### The ring alone at `cubic`, and after an incast (4-host switch, 16 MiB)",
    "",
    f"`{SWEEP} 12`: 5 runs of the ring alone, then 3 of"
    " `naive`, the ring and `tree` in blocks (the ring's connections carried `naive`'s incast"
    " just before), 5 timed calls each, nothing else running. busbw / line rate of the median"
    " call [slowest–fastest call]; retransmitted: TCP segments all four hosts retransmitted"
    " in the whole run (`nstat`).",
    "",
    "| run | ring busbw / line rate | retransmitted |",
    "|---|---|---|",
  ]
  for f in files:
    r = next(r for r in cluster_rows.bench_rows(d / f.name) if r["algorithm"] == "ring")
    rate = cluster_rows.network(r)["link_Bps"]
    bus = r["bytes"] * 2 * 3 / 4 / rate * 1e6  # 4 hosts: 2(p-1)/p n at the line rate, in us
    lines.append(
      f"| {f.stem} | {bus / r['time_us']:.3f} [{bus / r['time_us_max']:.3f}–"
      f"{bus / r['time_us_min']:.3f}] | {retrans.get(f.stem, 0)} |"
    )
  return [*lines, ""]


def rootless_table(root: Path) -> list[str]:
  """The same bench on the 4-host switch built as root and rootless (``cluster
  --rootless``: in a user namespace), alternating, runs in ``rootless/`` (step 11 of
  ``run.py sweep``): each time as the median over runs [min–max], and per run the
  rootless time over the root time of the run beside it."""
  runs = {
    (mode, int(f.stem.rsplit("run", 1)[1])): cluster_rows.seconds(cluster_rows.bench_rows(f))
    for mode in ("root", "rootless")
    for f in sorted((root / "rootless").glob(f"{mode}_run*.jsonl"))
  }
  if not runs:
    return []
  ids = sorted({i for _, i in runs if ("root", i) in runs and ("rootless", i) in runs})
  cells = sorted({c for i in ids for c in runs[("root", i)]}, key=lambda c: (c[1], c[0]))

  lines = [
    f"### Built as root and rootless: the same cluster (4-host switch, {len(ids)} runs each)",
    "",
    f"`{SWEEP} 11`: the same bench (`--order blocks -a 3`,"
    " 200 Mbit/s, 16 KiB TCP queue, the hosts' default congestion control) with the cluster built"
    " as root and with `--rootless` (in a user namespace, as a user without root gets it),"
    " alternating. Seconds, median over runs [min–max]; the ratio is per run, rootless over"
    " the root run just before it.",
    "",
    "| algorithm | per host | root (s) | rootless (s) | rootless / root |",
    "|---|---|---|---|---|",
  ]
  for alg, n in cells:
    if not all((alg, n) in runs[(m, i)] for m in ("root", "rootless") for i in ids):
      continue
    root_t = [runs[("root", i)][(alg, n)] for i in ids]
    less = [runs[("rootless", i)][(alg, n)] for i in ids]
    ratio = [b / a for a, b in zip(root_t, less)]
    lines.append(
      f"| {alg} | {units.format_bytes(n)} | {spread(root_t, '.3f')} | {spread(less, '.3f')} | {spread(ratio)} |"
    )
  return [*lines, ""]


def wire_table(root: Path) -> list[str]:
  rows = results.read_rows(root / "wire_bytes.jsonl", "wire")
  if not rows:
    return []
  lines = [
    "### Bytes on the wire per host (4 MiB per participant, switch)",
    "",
    "Each host's interface counter (tx_bytes) per call / the schedule's bytes for that host:"
    " host 0 (the root of naive and tree) and the range over all hosts.",
    "",
    "| algorithm | p | host 0 sent (MB) | schedule (MB) | host 0 ratio | min–max ratio over hosts |",
    "|---|---|---|---|---|---|",
  ]
  keys = list(dict.fromkeys((r["algorithm"], r["p"]) for r in rows))
  for a, p in sorted(keys, key=lambda k: (k[0], k[1])):
    mine = [r for r in rows if r["algorithm"] == a and r["p"] == p]
    h0 = next(r for r in mine if r["host"] == 0)
    ratios = [r["ratio"] for r in mine if r["ratio"]]
    lines.append(
      f"| {a} | {p} | {h0['wire_bytes'] / 1e6:.2f} | {h0['schedule_bytes'] / 1e6:.2f} |"
      f" {h0['ratio']:.3f} | {min(ratios):.3f}–{max(ratios):.3f} |"
    )
  return [*lines, ""]


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  text = [*tcp_queue_table(root), *mtu_table(root), *congestion_control_table(root),
          *queue_table(root), *ring_alone_table(root), *rootless_table(root), *wire_table(root)]  # fmt: skip
  return {
    "link_settings.md": "# The link's settings (tables from the committed rows)\n\n"
    + "\n".join(text)
    + "\n"
  }


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
