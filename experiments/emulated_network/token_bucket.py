"""token_bucket.md from rows/: does pricing each link's token bucket bring the replay closer
to the wire? (no measurement here)

    python experiments/emulated_network/token_bucket.py

Each shaped link of ``allreduce-jax cluster`` is a ``tbf`` bucket holding 4 ms of its rate: a
link idle for 4 ms passes its next 100 KB (at 200 Mbit/s) at veth speed. The sets timed in
blocks with ``--tcp-queue 16KiB`` (:data:`SETS`), each cell against the half-duplex replay
without and with the bucket priced (``gloo_model.emulated_seconds(..., bucket_s=)``), α fitted
for each on the set's own 4 and 64 KiB rows, at the rows' own link rate.
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import cluster_rows, cost_model, gloo_model, results, units

HERE = Path(__file__).resolve().parent
NETS = (("switch", 4), ("switch", 8), ("fat_tree:4:2", 8), ("torus:8", 8))
SETS = {  # folder under rows/ -> its title
  "tcp_queue_16k": "`tcp_queue_16k/` (step 5 of the sweep)",
  "tcp_queue_16k/repeat": "`tcp_queue_16k/repeat/` (step 6)",
  "tcp_queue_16k/cubic": "`tcp_queue_16k/cubic/` (step 7: cubic)",
  "tcp_queue_16k/cubic_finish": "`tcp_queue_16k/cubic_finish/` (step 8: cubic, each reduced slice"
  " finished by its owner)",
  "tcp_queue_16k/cubic_finish/repeat": "`tcp_queue_16k/cubic_finish/repeat/` (step 10: step 8 run"
  " again)",
}

INTRO = """\
# The replay with each link's token bucket

Every link a bucket of {bucket_ms:g} ms of its rate; measured / model within 0.8–1.2 counts \
as within 20 %. Hand-written algorithms, sizes ≥ 1 MiB.
"""

SET = """\
## {title}

| network | α (no bucket / bucket) | within 20 %: no bucket | with the bucket |
|---|---|---|---|
{networks}

<details><summary>every cell: measured / model</summary>

| network | algorithm | size | no bucket | bucket |
|---|---|---|---|---|
{cells}

</details>
"""


def network_cells(rows: list[dict], net: str, p: int) -> tuple[dict, list[dict]]:
  """The α of each model and every hand-written cell ≥ 1 MiB of one network's rows, its
  measured time over the replay without (``r0``) and with (``r1``) the buckets."""
  rate = cluster_rows.link_rate(rows)
  alpha = {"half": cluster_rows.fit_alpha(rows, p, net, "half"), "full": 0.0}
  alpha["bucket"] = cluster_rows.fit_alpha(rows, p, net, "half", bucket=True)
  cells = []
  for (a, n), t in {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in rows}.items():
    if n >= 1 << 20 and a != "psum":
      c = cluster_rows.replay_cell(a, p, n, net, t, alpha, rate)
      cells.append({**c, "r0": c["measured_s"] / c["model_half_s"],
                    "r1": c["measured_s"] / c["model_bucket_s"]})  # fmt: skip
  return alpha, cells


def set_table(root: Path, folder: str) -> str:
  """One set: per network how many cells each model prices within 20 %, then every cell."""
  networks, cells = [], []
  for net, p in NETS:
    rows = cluster_rows.bench_rows(root / folder / f"blocks_{net.replace(':', '_')}_{p}.jsonl")
    if not rows:
      continue
    alpha, mine = network_cells(rows, net, p)
    within = [sum(0.8 <= c[k] <= 1.2 for c in mine) for k in ("r0", "r1")]
    networks.append(
      f"| {net}, {p} hosts | {alpha['half'] * 1e3:.2f} / {alpha['bucket'] * 1e3:.2f} ms |"
      f" {within[0]} of {len(mine)} | {within[1]} of {len(mine)} |"
    )
    cells += [f"| {net}, {p} hosts | {c['algorithm']} | {units.format_bytes(c['bytes'])} |"
              f" {c['r0']:.2f} | {c['r1']:.2f} |" for c in mine]  # fmt: skip
  return SET.format(title=SETS[folder], networks="\n".join(networks), cells="\n".join(cells))


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  paths = sorted([*root.rglob("bench_*.jsonl"), *root.rglob("blocks_*.jsonl")])
  traced = gloo_model.traced_params(r for path in paths for r in results.read_rows(path, "bench"))
  rate = cluster_rows.link_rate(
    cluster_rows.bench_rows(root / "tcp_queue_16k" / "blocks_switch_4.jsonl")
  )
  with cost_model.use_params(traced):
    text = [INTRO.format(bucket_ms=gloo_model.link_bucket_s(rate) * 1e3)]
    text += [set_table(root, folder) for folder in SETS]
  return {"token_bucket.md": "\n".join(text) + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
