"""Does pricing each link's token bucket bring the replay closer to the wire?

Each shaped link of ``allreduce-jax cluster`` is a ``tbf`` token bucket holding 4 ms of
its rate (100 KB at 200 Mbit/s; ``allreduce_jax.netns``): a link that was idle for 4 ms
passes its next 100 KB at veth speed, not at the rate. The replay that
``experiments/network_tables.py`` compares with the wire
(:func:`allreduce_jax.gloo_model.steps_as_run`, half duplex, α fitted) prices every
byte at the rate. This replays the same steps with a bucket on every directed link:

- a step starts with α of software time, during which every link refills;
- each link then sends its bytes less the tokens it holds; the step ends when the
  slowest link is done, and every link keeps what is left of its tokens plus what the
  step's time refilled (at most the bucket) for the next step;
- every link starts full (the calls of ``bench`` are further apart than 4 ms).

α is fitted per network from the 4 and 64 KiB rows, as ``network_tables.py`` fits it
(least squares; with the bucket by a bounded 1-D search). For the committed sets timed
in blocks with ``--tcp-queue 16KiB`` (``tcp_queue_16k/``, its repeat, and the hosts at
``cubic``) it prints how
many hand-written algorithm × size cells at ≥ 1 MiB each model prices within 20 %, and
every cell's measured / model with and without the bucket. No measurement here.

    python experiments/token_bucket_replay.py [docs/results/network] \\
        > docs/results/network/token_bucket.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import network_tables as nt
import numpy as np
from scipy.optimize import minimize_scalar

from allreduce_jax import gloo_model, topology

#: The bucket of every emulated link, in seconds of its own rate (``netns._shape``:
#: ``max(64 KiB, rate × 4 ms)``, which is 4 ms for every rate from 16.4 MB/s).
BUCKET_S = 0.004


def _link_seconds(alg: str, p: int, n: int, net: str) -> list[np.ndarray | None]:
  """Per step, every directed link's seconds of sending at the rate (None: no message)."""
  top = gloo_model.emulated(net).fit(p)
  steps = gloo_model.steps_as_run(alg, topology.axis_sizes(alg, p, top), n, "half")
  beta = gloo_model.link_params(nt.RATE, 0.0).beta
  memo: dict[int, np.ndarray | None] = {}
  out = []
  for step in steps:
    if id(step) not in memo:
      loads = topology.step_link_loads(step, top) if step else {}
      # One vector of every link of every class, in a fixed order (load: n per capacity).
      memo[id(step)] = (
        np.concatenate([np.ravel(loads[c]) for c in sorted(loads)]) * n * beta if loads else None
      )
    out.append(memo[id(step)])
  return out


def bucket_seconds(alg: str, p: int, n: int, net: str, alpha: float, bucket: float) -> float:
  """The replayed time with a token bucket of ``bucket`` seconds on every link."""
  total, tokens = 0.0, None
  for need in _link_seconds(alg, p, n, net):
    if need is None:
      total += alpha
      continue
    if tokens is None or tokens.shape != need.shape:
      tokens = np.full(need.shape, bucket)
    have = np.minimum(bucket, tokens + alpha)
    data = max(0.0, float(np.max(need - have)))
    tokens = np.minimum(bucket, have - need + data)
    total += alpha + data
  return total


def fit_alpha(rows: list[dict], p: int, net: str, bucket: float) -> float:
  small = [r for r in rows if r["bytes"] in nt.SMALL]
  if bucket == 0:
    return nt.fit_alpha(rows, p, net, "half")

  def err(a):
    return sum(
      (bucket_seconds(r["algorithm"], p, r["bytes"], net, a, bucket) - r["time_us"] * 1e-6) ** 2
      for r in small
    )

  return float(minimize_scalar(err, bounds=(0.0, 0.02), method="bounded").x)


def compare(where: Path, title: str) -> list[str]:
  lines = [f"## {title}", "", "| network | α (no bucket / bucket) | within 20 %: no bucket | with the bucket |",
           "|---|---|---|---|"]  # fmt: skip
  cells = []
  for net, p in nt.NETS:
    rows = nt._good(where, "blocks_" + f"{net.replace(':', '_')}_{p}.jsonl")
    if not rows:
      continue
    a0, a1 = fit_alpha(rows, p, net, 0.0), fit_alpha(rows, p, net, BUCKET_S)
    good = [0, 0]
    mine = [(a, n, t) for (a, n), t in nt._times(rows).items() if n >= 1 << 20 and a != "psum"]
    for a, n, t in mine:
      r0 = t / bucket_seconds(a, p, n, net, a0, 0.0)
      r1 = t / bucket_seconds(a, p, n, net, a1, BUCKET_S)
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
  lines += compare(root / "tcp_queue_16k", "`tcp_queue_16k/` (step 5 of the sweep)")
  lines += compare(root / "tcp_queue_16k" / "repeat", "`tcp_queue_16k/repeat/` (step 6)")
  lines += compare(root / "tcp_queue_16k" / "cubic", "`tcp_queue_16k/cubic/` (step 7: cubic)")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
