"""Does pricing each link's token bucket bring the replay closer to the wire?

Each shaped link of ``allreduce-jax cluster`` is a ``tbf`` token bucket holding 4 ms of
its rate (100 KB at 200 Mbit/s; ``allreduce_jax.netns.bucket_bytes``): a link that was
idle for 4 ms passes its next 100 KB at veth speed, not at the rate. This sets the
replay that ``experiments/network_tables.py`` compares with the wire (half duplex, α
fitted, every byte at the rate) beside the same replay with every directed link a
bucket (``allreduce_jax.gloo_model.predict_seconds(..., bucket_s=)``: each step's α
refills the buckets, each link sends its bytes less the tokens it holds, the step ends
when the slowest link is done; every bucket starts full, as the calls of ``bench`` are
further apart than 4 ms).

α is fitted per network from the 4 and 64 KiB rows for each model
(``network_tables.fit_alpha``). For the committed sets timed in blocks with
``--tcp-queue 16KiB`` (``tcp_queue_16k/``, its repeat, and the hosts at ``cubic``) it
prints how many hand-written algorithm × size cells at ≥ 1 MiB each model prices
within 20 %, and every cell's measured / model with and without the bucket. No
measurement here.

    python experiments/token_bucket_replay.py [docs/results/network] \\
        > docs/results/network/token_bucket.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import network_tables as nt

from allreduce_jax import cost_model

BUCKET_S = nt.BUCKET_S


def compare(where: Path, title: str) -> list[str]:
  lines = [f"## {title}", "", "| network | α (no bucket / bucket) | within 20 %: no bucket | with the bucket |",
           "|---|---|---|---|"]  # fmt: skip
  cells = []
  for net, p in nt.NETS:
    rows = nt._good(where, "blocks_" + f"{net.replace(':', '_')}_{p}.jsonl")
    if not rows:
      continue
    a0, a1 = nt.fit_alpha(rows, p, net, "half"), nt.fit_alpha(rows, p, net, "half", BUCKET_S)
    good = [0, 0]
    mine = [(a, n, t) for (a, n), t in nt._times(rows).items() if n >= 1 << 20 and a != "psum"]
    for a, n, t in mine:
      r0 = t / nt.model(a, p, n, net, "half", a0)
      r1 = t / nt.model(a, p, n, net, "half", a1, BUCKET_S)
      good[0] += 0.8 <= r0 <= 1.2
      good[1] += 0.8 <= r1 <= 1.2
      cells.append(f"| {net}, {p} hosts | {a} | {nt._mib(n)} | {r0:.2f} | {r1:.2f} |")
    lines.append(
      f"| {net}, {p} hosts | {a0 * 1e3:.2f} / {a1 * 1e3:.2f} ms | {good[0]} of {len(mine)}"
      f" | {good[1]} of {len(mine)} |"
    )
  return [*lines, "", "<details><summary>every cell: measured / model</summary>", "",
          "| network | algorithm | size | no bucket | bucket |", "|---|---|---|---|---|",
          *cells, "", "</details>", ""]  # fmt: skip


def main(argv=None) -> int:
  root = Path((argv or sys.argv[1:] or ["docs/results/network"])[0])
  lines = [
    "# The replay with each link's token bucket (`experiments/token_bucket_replay.py`)",
    "",
    f"Every link a bucket of {BUCKET_S * 1e3:g} ms of its rate; measured / model within"
    " 0.8–1.2 counts as within 20 %. Hand-written algorithms, sizes ≥ 1 MiB.",
    "",
  ]
  with cost_model.use_params(nt.traced_params(root)):  # the schedules as they ran
    lines += compare(root / "tcp_queue_16k", "`tcp_queue_16k/` (step 5 of the sweep)")
    lines += compare(root / "tcp_queue_16k" / "repeat", "`tcp_queue_16k/repeat/` (step 6)")
    lines += compare(root / "tcp_queue_16k" / "cubic", "`tcp_queue_16k/cubic/` (step 7: cubic)")
    lines += compare(
      root / "tcp_queue_16k" / "cubic_finish",
      "`tcp_queue_16k/cubic_finish/` (step 8: cubic, each reduced slice finished by its owner)",
    )
    lines += compare(
      root / "tcp_queue_16k" / "cubic_finish" / "repeat",
      "`tcp_queue_16k/cubic_finish/repeat/` (step 10: step 8 run again)",
    )
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
