"""The faults study's failure tables, ``failures.md`` from ``rows/``: a link down
mid-collective, a host killed or stopped, training that loses a host and recovers, kills
during checkpoint saves, a slowed host kept or isolated (``run.py`` measures them).

    python experiments/faults/failures.py   # writes failures.md
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from allreduce_jax import results, units

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
# TCP's retransmission timeouts after a loss (Linux: 200 ms at least, doubling): the
# moments, after the loss, at which a segment is sent again.
RTO_S = 0.2

DOWN = """\
## A link down mid-collective (host 1, 1 MiB per host, 4 hosts on a switch)

Every call's time (bench -I, process 0); a call slowed: over 3× the median; time lost: the \
slowed calls' time beyond the median; next TCP retry: the first retransmission at or after the \
outage (200 ms doubling: 0.2, 0.6, 1.4, 3, 6.2 s after the loss).

{table}
"""
KILL = """\
## A host killed or stopped mid-collective (4 hosts on a switch)

Host 1 SIGKILLed or SIGSTOPped T s after the hosts joined, during back-to-back calls (1 MiB: \
they start 2 s or more after joining); times: min–max over the runs (the launcher prints its \
time to 0.1 s).

{table}
"""
RECOVERY = """\
## train sync on 4 hosts, a host killed mid-run

{table}

Final test accuracy over the seeds (one run per seed; each run's own seed for initialization \
and data order):

{accuracy}
"""
TORN = """\
## A kill during checkpoint saves

{summary}
"""
SLOW_HOST = """\
## A slowed host kept in the job or isolated (train sync, 600 steps)

Host 1's process held to 1/4 of a core (cpu:1=0.25@0); time to 95 %: steps to 95 % × the \
training loop's seconds a step (compile and evaluations included).

{table}

Over the seeds (accuracy: the last run of each seed; time to 95 %: every run):

{accuracy}

{time}
"""


def _read(name: str) -> list[dict]:
  """The rows of ``rows/name`` (their kind: the file's stem)."""
  return results.read_rows(ROWS / name, name.removesuffix(".jsonl"))


def kill_table() -> str:
  """Per algorithm, size and fault kind: runs, how many named host 1 (the right host),
  and the spread of the times after the fault."""
  groups: dict[tuple, list[dict]] = {}
  for r in _read("kill.jsonl"):
    kind = r["fault"].split(":")[0]
    alg = r["algorithm"] + (" (2 devices a host)" if r.get("devices_per_host", 1) > 1 else "")
    key = (kind, r.get("bytes", "4MiB"), " ".join(r.get("options", [])), alg)
    groups.setdefault(key, []).append(r)
  lines = ["| fault | per host | options | algorithm | runs | host 1 named | the launcher named |"
           " at (s after joining) | named after the fault (s) | all stopped after (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for (kind, size, opts, alg), rs in groups.items():
    right = [r for r in rs if r["named_rank"] == 1]
    named = [r["named_after_kill_s"] for r in rs if r["named_after_kill_s"] is not None]
    stopped = [r["all_stopped_after_kill_s"] for r in rs if r["named_after_kill_s"] is not None]
    who = _named(f"process {r['named_rank']} {r['named_status']}" for r in rs if r["named_status"])
    ats = ", ".join(f"{float(r['fault'].split('@')[1]):g}" for r in rs)
    lines.append(f"| {kind} | {size} | {opts or '–'} | {alg} | {len(rs)} | {len(right)} | {who} |"
                 f" {ats} | {units.span(named)} | {units.span(stopped)} |")  # fmt: skip
  return "\n".join(lines)


def link_down_table() -> str:
  """Per algorithm, outage and options: runs, exits, #wrong, and min–max over the runs."""
  groups: dict[tuple, list[dict]] = {}
  for r in _read("link_down.jsonl"):
    groups.setdefault((r["algorithm"], r["down_s"], " ".join(r["options"])), []).append(r)
  if not groups:
    return "(not measured)"
  lines = ["| algorithm | down (s) | options | runs | exit | #wrong | median call (ms) |"
           " slowest call (s) | calls slowed | time lost (s) | next TCP retry (s) |"
           " stopped after the down (s) | the launcher named | the coordinator's log named |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for (alg, d, opts), rs in groups.items():
    col = lambda k, rs=rs: [r[k] for r in rs if r.get(k) is not None]  # noqa: E731
    join = lambda xs: ", ".join(dict.fromkeys(str(x) for x in xs)) or "–"  # noqa: E731
    slowest = [x / 1e3 for x in col("slowest_ms")]
    lines.append(f"| {alg} | {d:g} | {opts or '–'} | {len(rs)} | {join(col('returncode'))} |"
                 f" {join(col('wrong'))} | {units.span(col('median_ms'), '.0f')} | {units.span(slowest)} |"
                 f" {join(col('calls_slowed'))} | {units.span(col('extra_s'))} |"
                 f" {next_retry(d):.1f} | {units.span(col('named_after_down_s'))} |"
                 f" {_named(r['named'] for r in rs)} | {_named(_unhealthy(r) for r in rs)} |")  # fmt: skip
  return "\n".join(lines)


def _named(names) -> str:
  """The launcher's names ("process 2 was killed by SIGABRT after 12.7 s", ...) as
  "process 2, 3 (was killed by SIGABRT)"."""
  found = [re.match(r"process (\d+) (.*?)(?: after .*)?$", x) for x in names if x]
  ranks = ", ".join(dict.fromkeys(m[1] for m in found if m))
  how = "; ".join(dict.fromkeys(m[2] for m in found if m))
  return f"process {ranks} ({how})" if ranks else "–"


def _unhealthy(row: dict) -> str | None:
  """The task JAX's coordination service reported unhealthy in the hosts' logs."""
  said = " ".join(row.get("logs_say", []))
  m = re.search(r"stopped sending heartbeats\): (\d+)", said)
  return f"process {m[1]} stopped sending heartbeats" if m else None


def recovery_table() -> str:
  rows = _read("recovery.jsonl")
  lines = ["| run | seed | hosts at the end | resumed from step | test acc | parameters sha256 |"
           " killed | named at (s) | restarted at (s) | wall (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for r in sorted(rows, key=lambda r: (r.get("seed", 0), r["run"])):
    at = re.search(r"kill:2@([0-9.]+)", " ".join(r["options"]))
    killed = f"host 2, {at[1]} s after joining" if at else "–"
    if r.get("killed_after_step") is not None:
      killed = f"host 2, after step {r['killed_after_step']}'s checkpoint"
    f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    lines.append(f"| {r['run']} | {r.get('seed', 0)} | {r['hosts_final']} |"
                 f" {r['resumed_from'] or '–'} |"
                 f" {r['final_test_acc']:.4f} | `{r['params_sha256']}` | {killed} |"
                 f" {f(r['named_after_s'])} | {f(r['restarted_after_s'])} | {r['wall_s']:.1f} |")  # fmt: skip
  return "\n".join(lines)


def _run_label(r: dict, concurrent: bool = False) -> str:
  """The run's name and its faults: ``elastic (kill:2@12)`` (``concurrent``: and
  ``--concurrent`` when the run did not wait for other cluster runs)."""
  faults = [o for o in r["options"] if re.match(r"[a-z]+:\d", o)]
  if r.get("killed_after_step") is not None:
    faults.append(f"kill:2 after step {r['killed_after_step']}")
  if concurrent and "--concurrent" in r["options"]:
    faults.append("--concurrent")
  return f"{r['run']} ({', '.join(faults)})" if faults else r["run"]


def seed_spread(rows: list[dict], key: str, per_seed: bool = True) -> str:
  """Per run (name and faults, in order of appearance; the first the reference): the
  seeds, ``key``'s min–max and mean ± sd over the values (``per_seed``: one a seed, the
  last row of a seed run twice; else every row, and runs with ``--concurrent`` apart:
  times); and how many lie within the first run's min–max."""
  by: dict[str, dict] = {}
  for i, r in enumerate(rows):
    if r.get(key) is not None:
      seed = r.get("seed", 0)
      by.setdefault(_run_label(r, not per_seed), {})[seed if per_seed else i] = (seed, r[key])
  if not by:
    return "(not measured)"
  runs = list(by)
  first = [x for _, x in by[runs[0]].values()]
  lo, hi = min(first), max(first)
  lines = [f"| run | seeds | values | {key} min–max | mean ± sd | within {runs[0]}'s min–max |",
           "|---|---|---|---|---|---|"]  # fmt: skip
  for name in runs:
    seeds = sorted({s for s, _ in by[name].values()})
    v = [x for _, x in by[name].values()]
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    inside = sum(lo <= x <= hi for x in v)
    lines.append(f"| {name} | {', '.join(map(str, seeds))} | {len(v)} | {units.span(v, '.4f')} |"
                 f" {statistics.mean(v):.4f} ± {sd:.4f} | {inside} of {len(v)} |")  # fmt: skip
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


def slow_host_table() -> str:
  """Per run name: the runs, and min–max over them."""
  groups: dict[str, list[dict]] = {}
  for r in _read("slow_host.jsonl"):  # runs that did not wait for other clusters apart
    concurrent = " (--concurrent)" if "--concurrent" in r["options"] else ""
    groups.setdefault(r["run"] + concurrent, []).append(r)
  if not groups:
    return "(not measured)"
  lines = ["| run | hosts | options | runs | final test acc | steps to 95 % | training (s) |"
           " s a step | time to 95 % (s) | cluster wall (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for name, rs in groups.items():
    r = rs[0]
    opts = " ".join(f"{float(o):g}" if re.fullmatch(r"[0-9.]+", o) else o for o in r["options"])
    col = lambda k, rs=rs: [x[k] for x in rs if x[k] is not None]  # noqa: E731
    steps = ", ".join(dict.fromkeys(str(x["steps_to_target"]) for x in rs))
    lines.append(f"| {name} | {r['hosts']} | {opts or '–'} | {len(rs)} |"
                 f" {units.span(col('final_test_acc'), '.4f')} | {steps} | {units.span(col('train_s'), '.1f')} |"
                 f" {units.span([x['train_s'] / x['steps'] for x in rs], '.3f')} |"
                 f" {units.span(col('time_to_target_s'), '.1f')} | {units.span(col('cluster_wall_s'), '.1f')} |")  # fmt: skip
  return "\n".join(lines)


def next_retry(down_s: float) -> float:
  """The first retransmission at or after an outage of ``down_s`` that began right after
  a send: RTO_S·(2^k − 1) for the smallest such k (200 ms, 600 ms, 1.4 s, 3 s, 6.2 s…)."""
  k = 1
  while RTO_S * (2**k - 1) < down_s:
    k += 1
  return RTO_S * (2**k - 1)


def tables() -> dict[str, str]:
  """``{"failures.md": text}`` from the committed rows."""
  recovery, slow_host = _read("recovery.jsonl"), _read("slow_host.jsonl")
  return {"failures.md": "\n".join([
    "# Faults: failures (generated by failures.py from rows/)", "",
    DOWN.format(table=link_down_table()),
    KILL.format(table=kill_table()),
    RECOVERY.format(table=recovery_table(), accuracy=seed_spread(recovery, "final_test_acc")),
    TORN.format(summary=torn_table()),
    SLOW_HOST.format(table=slow_host_table(),
                     accuracy=seed_spread(slow_host, "final_test_acc"),
                     time=seed_spread(slow_host, "time_to_target_s", per_seed=False)),
  ])}  # fmt: skip


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
