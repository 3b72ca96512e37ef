"""Faults on the emulated cluster: one slow link per algorithm, the time until a killed
host is named, and a training run that loses a host and recovers.

    python experiments/faults/faults.py slow-link   # bench rows: healthy, one link at 1/2, 1/10
    python experiments/faults/faults.py kill        # a host killed mid-collective: time to name it
    python experiments/faults/faults.py recovery    # train sync killed mid-run: --restarts, --elastic
    python experiments/faults/faults.py torn        # a saver SIGKILLed at 20 random moments
    python experiments/faults/faults.py tables      # tables.md and slow_link.png from the rows

Every measurement runs ``allreduce-jax cluster`` (root, or rootless) on 4 hosts of a switch
whose links run at 200 Mbit/s each way; faults come from ``cluster --fault``.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
HOSTS = 4
LINK = "200Mbit"
RATE = 25e6  # bytes/s, 200 Mbit/s
SLOW = {1: None, 2: "100Mbit", 10: "20Mbit"}  # k -> host 1's rate (link at 1/k)
ALGORITHMS = "ring,bidirectional_ring,tree,halving_doubling,naive,psum"
KILL_ALGORITHMS = ("ring", "naive", "psum")
KILL_AT = (8.0, 11.0, 14.0)  # seconds after the hosts joined
CLUSTER = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(HOSTS),
           "--link", LINK, "--timeout", "900"]  # fmt: skip


def _read(name: str) -> list[dict]:
  path = ROWS / name
  return (
    [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
  )


def _append(name: str, row: dict) -> None:
  ROWS.mkdir(exist_ok=True)
  with open(ROWS / name, "a") as f:
    f.write(json.dumps(row) + "\n")


def slow_link() -> None:
  """Every algorithm at 1 and 4 MiB per host, healthy and with host 1's link at 1/2, 1/10."""
  for rate in SLOW.values():
    faults = ["--fault", f"link:1={rate}@0"] if rate else []
    subprocess.run([*CLUSTER, *faults, "--", "bench", "-n", "3", "-w", "1", "--no-uneven",
                    "-a", "3", "--algorithms", ALGORITHMS, "-b", "1MiB", "-e", "4MiB", "-f", "4",
                    "--out", str(ROWS / "slow_link.jsonl"), "--plot",
                    str(Path(tempfile.gettempdir()) / "slow_link_bench.png")], check=True)  # fmt: skip


def kill() -> None:
  """Host 1 SIGKILLed at three moments of a bench loop, per algorithm: when it is named and
  when every survivor has stopped (the cluster command returned), after the kill."""
  for algorithm in KILL_ALGORITHMS:
    for at in KILL_AT:
      with tempfile.TemporaryDirectory() as logs:
        res = subprocess.run([*CLUSTER, "--log-dir", logs, "--fault", f"kill:1@{at}", "--",
                              "bench", "-n", "1000", "-w", "1", "--algorithms", algorithm,
                              "-b", "4MiB", "-e", "4MiB", "--out", f"{logs}/rows.jsonl"],
                             capture_output=True, text=True)  # fmt: skip
        ended = time.time()
        (fault,) = [json.loads(x) for x in Path(logs, "faults.jsonl").read_text().splitlines()]
      named = re.search(r"process (\d+) of \d+ \(pid \d+\) (.*?) after ([0-9.]+) s", res.stderr)
      _append("kill.jsonl", {
        "algorithm": algorithm, "hosts": HOSTS, "link": LINK, "fault": fault["fault"],
        "returncode": res.returncode, "named_rank": int(named[1]) if named else None,
        "named_status": named[2] if named else None,
        "named_after_kill_s": float(named[3]) - fault["after_start_s"] if named else None,
        "all_stopped_after_kill_s": ended - fault["unix_time"],
      })  # fmt: skip


def _train(name: str, extra: list[str], tmp: Path) -> dict:
  ck = tmp / name
  argv = [*CLUSTER, "--log-dir", str(tmp / f"logs-{name}"), *extra, "--", "train", "sync",
          "--workers", str(HOSTS), "--steps", "1200", "--eval-every", "100", "--checkpoint-dir",
          str(ck), "--checkpoint-every", "50", "--out", str(tmp / f"out-{name}")]  # fmt: skip
  t0 = time.monotonic()
  res = subprocess.run(argv, capture_output=True, text=True)
  wall = time.monotonic() - t0
  line = next((x for x in res.stdout.splitlines() if x.startswith("seed 0:")), "")
  restart = re.search(r"restart 1 of 1 after .*?\(([0-9.]+) s since the start\)", res.stderr)
  named = re.search(r"process (\d+) of \d+ \(pid \d+\) was killed by SIGKILL after ([0-9.]+)", res.stderr)  # fmt: skip
  joined = re.search(r"hosts joined ([0-9.]+) s after the start", res.stderr)
  resumed = re.search(r"resumed from step \[([0-9, ]+)\]", line)
  return {
    "run": name, "hosts": HOSTS, "link": LINK, "options": extra, "returncode": res.returncode,
    "final_test_acc": float(re.search(r"test acc ([0-9.]+)", line)[1]) if line else None,
    "params_sha256": line.split("sha256 ")[1].strip() if "sha256" in line else None,
    "resumed_from": [int(s) for s in resumed[1].split(",")] if resumed else [],
    "hosts_final": int(re.findall(r"# cluster: (\d+) process\(es\)", res.stderr)[-1]),
    "wall_s": wall,
    "hosts_joined_s": float(joined[1]) if joined else None,
    "named_after_s": float(named[2]) if named else None,
    "restarted_after_s": float(restart[1]) if restart else None,
  }  # fmt: skip


def recovery(names: list[str]) -> None:
  """train sync on 4 hosts: uninterrupted, host 2 killed 12 s after joining with
  --restarts 1, and the same with --elastic (it finishes on 3 hosts); ``names``: only
  those runs."""
  kill = ["--fault", "kill:2@12", "--restarts", "1"]
  runs = {"uninterrupted": [], "restart": kill, "elastic": [*kill, "--elastic"]}
  for name in names or runs:
    with tempfile.TemporaryDirectory() as tmp:
      _append("recovery.jsonl", _train(name, runs[name], Path(tmp)))


# A process that saves 16 MiB checkpoints in a loop; step k's arrays all hold k.
SAVER = """
import sys
import numpy as np
from allreduce_jax.training import checkpoint
ck = checkpoint.Checkpoints(sys.argv[1], 1, {"run": "torn"})
start = (ck.latest() or 0) + 1
print("saving", flush=True)
for step in range(start, start + 100_000):
  a = np.full((1 << 22,), step, np.float32)
  ck.save(checkpoint.State(step, {"w": a}, {}, examples=step, workers=1, learning_rate=0.1,
                           losses=[float(step)]))
"""


def torn(kills: int = 20) -> None:
  """SIGKILLs the saver at ``kills`` random moments (0.1-2 s after it started saving);
  after each, whether a save was torn (a temporary folder left), and whether the restore
  succeeded from a complete checkpoint (every value its step's) leaving no torn folder."""
  import random

  import numpy as np

  from allreduce_jax.training import checkpoint

  rng = random.Random(1)
  with tempfile.TemporaryDirectory() as d:
    for i in range(kills):
      p = subprocess.Popen([sys.executable, "-c", SAVER, d], stdout=subprocess.PIPE, text=True)
      assert p.stdout.readline().strip() == "saving"
      wait = rng.uniform(0.1, 2.0)
      time.sleep(wait)
      p.kill()
      p.wait()
      p.stdout.close()
      left = sorted(q.name for q in Path(d).iterdir() if "tmp" in q.name)
      ck = checkpoint.Checkpoints(d, 1, {"run": "torn"})
      state = ck.restore({"w": np.zeros((1 << 22,), np.float32)}, {})
      ck.close()
      complete = bool(state is not None and np.all(state.params["w"] == state.step)
                      and state.losses == [float(state.step)])  # fmt: skip
      _append("torn_saves.jsonl", {
        "kill": i, "after_s": wait, "torn_folders": left, "restored_step": state.step if state else None,
        "restore_complete": complete, "torn_left_after": any("tmp" in q.name for q in Path(d).iterdir()),
      })  # fmt: skip


# ------------------------------------------------------------------ tables and the figure


def _slow_rows() -> list[dict]:
  """Bench rows with the slow-link factor k (1: healthy) read off their network's faults."""
  out = []
  for r in _read("slow_link.jsonl"):
    faults = json.loads(r["key"]).get("network", {}).get("faults", [])
    rate = faults[0].split("=")[1].split("@")[0] if faults else None
    k = next(k for k, v in SLOW.items() if v == rate)
    out.append({**r, "k": k})
  return out


def slow_link_table() -> str:
  rows = _slow_rows()
  head = ["| algorithm | MiB | " + " | ".join(f"1/{k} ms" for k in SLOW)
          + " | " + " | ".join(f"1/{k} × healthy" for k in SLOW if k > 1)
          + " | " + " | ".join(f"1/{k} in n·k/B" for k in SLOW) + " |"]  # fmt: skip
  head.append("|" + "---|" * (2 + 3 * len(SLOW) - 1))
  lines = []
  for alg in ALGORITHMS.split(","):
    for size in sorted({r["bytes"] for r in rows}):
      t = {r["k"]: r["time_us"] for r in rows if r["algorithm"] == alg and r["bytes"] == size}
      if not t:
        continue
      ms = [f"{t[k] / 1e3:.0f}" if k in t else "–" for k in SLOW]
      ratio = [f"{t[k] / t[1]:.1f}" if k in t and 1 in t else "–" for k in SLOW if k > 1]
      bound = [f"{t[k] / 1e6 / (size * k / RATE):.2f}" if k in t else "–" for k in SLOW]
      lines.append(f"| {alg} | {size / 2**20:g} | {' | '.join(ms)} | {' | '.join(ratio)} |"
                   f" {' | '.join(bound)} |")  # fmt: skip
  return "\n".join(head + lines)


def kill_table() -> str:
  rows = _read("kill.jsonl")
  lines = ["| algorithm | fault | named | host named after the kill (s) | all stopped after (s) |",
           "|---|---|---|---|---|"]  # fmt: skip
  for r in rows:
    after = r["named_after_kill_s"]
    lines.append(f"| {r['algorithm']} | {r['fault']} | process {r['named_rank']} {r['named_status']}"
                 f" | {after:.1f} | {r['all_stopped_after_kill_s']:.1f} |" if after is not None
                 else f"| {r['algorithm']} | {r['fault']} | not named | – | – |")  # fmt: skip
  return "\n".join(lines)


def recovery_table() -> str:
  rows = _read("recovery.jsonl")
  lines = ["| run | hosts at the end | resumed from step | test acc | parameters sha256 | killed |"
           " named at (s) | restarted at (s) | wall (s) |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for r in rows:
    killed = "host 2, 12 s after joining" if r["options"] else "–"
    f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    lines.append(f"| {r['run']} | {r['hosts_final']} | {r['resumed_from'] or '–'} |"
                 f" {r['final_test_acc']:.4f} | `{r['params_sha256']}` | {killed} |"
                 f" {f(r['named_after_s'])} | {f(r['restarted_after_s'])} | {r['wall_s']:.1f} |")  # fmt: skip
  return "\n".join(lines)


def torn_table() -> str:
  rows = _read("torn_saves.jsonl")
  if not rows:
    return "(not measured)"
  torn_n = sum(bool(r["torn_folders"]) for r in rows)
  ok = sum(r["restore_complete"] and not r["torn_left_after"] for r in rows)
  return (f"{len(rows)} kills of a saver (16 MiB a checkpoint) at random moments: {torn_n} tore a"
          f" save (a temporary folder left); {ok} of {len(rows)} restores came from a complete"
          " checkpoint, every value its step's, and left no torn folder.")  # fmt: skip


# ------------------------------------------------------------ the replay with the slow link

EMULATED = HERE.parent / "emulated_network" / "rows" / "tcp_queue_16k"


@functools.lru_cache
def _alpha(net: str, p: int) -> float:
  """α per step of a healthy run of ``net`` on ``p`` hosts: ``gloo_model.fit_alpha`` on the
  emulated network study's 4 and 64 KiB rows (timed in blocks at the same 16 KiB TCP
  queue); the switch's of ``p`` hosts where that study has no such network; 0 if neither."""
  from allreduce_jax import gloo_model

  for name in (net, "switch"):
    path = EMULATED / f"blocks_{name.replace(':', '_')}_{p}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [r for r in map(json.loads, filter(str.strip, lines)) if r.get("wrong") == 0]
    if rows:
      return gloo_model.fit_alpha(rows, p, name, rate=RATE)
  return 0.0


def _link_label(c: dict) -> str:
  return ", ".join(f"h{h} {v * 8 / 1e6:g} Mbit/s" for h, v in c["link_rates"].items()) or "healthy"


def replay_tables() -> list[str]:
  """Every slow-link row against the replay with that link's rate (half duplex, α of a
  healthy run) and the cut bound, then ``auto`` told the rates against the best measured."""
  from allreduce_jax import cost_model, gloo_model

  rows = _read("slow_link.jsonl")
  with cost_model.use_params(gloo_model.traced_params(rows)):
    cells = gloo_model.link_rate_cells(rows, _alpha)
    picks = {d: gloo_model.auto_picks(cells, _alpha, d) for d in ("half", "full")}
  f = lambda v: "–" if v is None else f"{v * 1e3:.0f}"  # noqa: E731
  r = lambda a, b: "–" if b is None else f"{a / b:.2f}"  # noqa: E731
  lines = ["| network | slow link | algorithm | MiB | measured ms | replay ms | measured / replay"
           " | bound ms | measured / bound |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  order = lambda c: (c["network"], c["hosts"], c["bytes"],  # noqa: E731
                     -min(c["link_rates"].values(), default=float("inf")))  # fmt: skip
  for c in sorted(cells, key=order):
    lines.append(f"| {c['network']}, {c['hosts']} hosts | {_link_label(c)} | {c['algorithm']} |"
                 f" {c['bytes'] / 2**20:g} | {f(c['measured_s'])} | {f(c['replay_s'])} |"
                 f" {r(c['measured_s'], c['replay_s'])} | {f(c['bound_s'])} |"
                 f" {r(c['measured_s'], c['bound_s'])} |")  # fmt: skip
  mine = [c for c in cells if c["replay_s"] and c["algorithm"] != "psum" and c["bytes"] >= 2**20]
  near = lambda cs: sum(0.8 <= c["measured_s"] / c["replay_s"] <= 1.2 for c in cs)  # noqa: E731
  per_alg = ", ".join(
    f"{a} {near([c for c in mine if c['algorithm'] == a])} of"
    f" {sum(c['algorithm'] == a for c in mine)}"
    for a in dict.fromkeys(c["algorithm"] for c in mine)
  )
  alphas = ", ".join(f"{n}, {p} hosts {_alpha(n, p) * 1e3:.2f} ms"
                     for n, p in dict.fromkeys((c["network"], c["hosts"]) for c in cells))  # fmt: skip
  auto = ["| network | slow link | MiB | auto's pick (half-duplex replay) | its time / best"
          " measured | best measured | best / best candidate | pick of the full-duplex replay"
          " / best |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for h, full in zip(picks["half"], picks["full"], strict=True):
    auto.append(f"| {h['network']}, {h['hosts']} hosts | {_link_label(h)} | {h['bytes'] / 2**20:g}"
                f" | {h['pick']} | {h['pick_s'] / h['best_s']:.2f} | {h['best']} |"
                f" {h['best_s'] / h['best_candidate_s']:.2f} | {full['pick']}"
                f" {full['pick_s'] / full['best_s']:.2f} |")  # fmt: skip
  return [
    "## The replay with the slow link, and the bound any exact algorithm meets", "",
    "Replay: `gloo_model.emulated_seconds(..., link_rates={host: bytes/s})`, the algorithm's"
    " schedule as XLA:CPU runs it over gloo (one ppermute at a time, an exchange's two"
    " directions in turn) on the network with the host's links at the fault's rate both ways"
    " (a link between two hosts at its slower end's),"
    f" β from each link's payload rate, α per step of a healthy run ({alphas}; the emulated"
    " network study's 4 and 64 KiB rows of that network, else of the switch with as many"
    " hosts), no token bucket. `psum` is replayed as a ring"
    " (its record's model). Bound: `gloo_model.cut_bound_seconds`, T ≥ max_h n / (c_h · s):"
    " every other host's result needs host h's n bytes and h's result the others' sum, so n"
    " bytes cross h's links each way (c_h: their rate together, one link on a switch or a"
    " fat tree, two on a ring of links; s = 0.956, the payload share at a 1500-byte MTU);"
    " on a switch the ring moves 2(p−1)/p·n through the slow link (1.5× at p = 4).", "",
    f"Measured within 20 % of the replay: {near(mine)} of {len(mine)} hand-written cells"
    f" (healthy {near([c for c in mine if not c['link_rates']])} of"
    f" {sum(not c['link_rates'] for c in mine)}); per algorithm: {per_alg}.", "",
    *lines, "",
    "### `auto` told the link rates", "",
    "`cost_model.use_topology(topology.with_link_rates(topology.switch(1), {1: 0.1}),"
    ' duplex="half")` around the tracing: `choose` among the measured candidates of `auto`,'
    " priced by the replay above; beside it the pick of the replay at full duplex (the"
    " topology replay's own assumption). Best measured includes `psum`.", "",
    *auto, "",
  ]  # fmt: skip


def tables() -> dict[str, str]:
  """``{"tables.md": text}`` from the committed rows."""
  parts = ["# Faults: tables (generated by faults.py from rows/)", "",
           "## One slow link (host 1 at 1/k of 200 Mbit/s), 4 hosts on a switch", "",
           "Median of the slowest process per call (bench -a 3); n·k/B: the time for n bytes"
           " through the slow link (the exact-algorithm bound is ≈ 1, the ring ≈ 1.5, the"
           " parameter server ≈ 2 at k = 10).", "", slow_link_table(), "",
           *replay_tables(),
           "## A host killed mid-collective (4 MiB per host, 4 hosts)", "", kill_table(), "",
           "## train sync on 4 hosts, a host killed mid-run", "", recovery_table(), "",
           "## A kill during checkpoint saves", "", torn_table(), ""]  # fmt: skip
  return {"tables.md": "\n".join(parts)}


def figure(path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  rows = [r for r in _slow_rows() if r["bytes"] == 4 * 2**20]
  fig, ax = plt.subplots(figsize=(6.4, 4))
  for alg in ALGORITHMS.split(","):
    pts = sorted((r["k"], r["time_us"] / 1e6) for r in rows if r["algorithm"] == alg)
    if pts:
      ax.plot([k for k, _ in pts], [t for _, t in pts], "o-", label=alg)
  ks = sorted(SLOW)
  n = 4 * 2**20
  ax.plot(ks, [n * k / RATE for k in ks], "k--", label="bound n·k/B")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xticks(ks, [f"1/{k}" for k in ks])
  ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
  ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax.set_yticks([0.2, 0.5, 1, 2, 5])
  ax.set_xlabel("host 1's link rate (of 200 Mbit/s)")
  ax.set_ylabel("all-reduce time (s), 4 MiB per host")
  ax.set_title("One slow link, 4 hosts on a switch")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
  what = argv[0] if argv else "tables"
  steps = {
    "slow-link": slow_link,
    "kill": kill,
    "recovery": lambda: recovery(argv[1:]),
    "torn": torn,
  }
  if what in steps:
    steps[what]()
  elif what == "tables":
    for name, text in tables().items():
      (HERE / name).write_text(text)
    figure(HERE / "slow_link.png")
  else:
    raise SystemExit(f"faults.py: expected one of {', '.join([*steps, 'tables'])}, got {what!r}.")


if __name__ == "__main__":
  main(sys.argv[1:])
