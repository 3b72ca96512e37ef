"""Every table of the compression study from its committed rows (no measurement here).

    python experiments/compression/tables.py

``rows/error_vs_p.md`` (:func:`error_table`: ``compression_error.py``'s rows), ``time.md`` (the
``bench --wires`` rows: in one process, on a 4-host 200 Mbit/s switch, its repeats at 16 MiB,
and the audit of the compiled programs' payloads) and the compressed training arms'
``rows/training/**/table_c.md`` and ``phase.md``
(:func:`allreduce_jax.training.experiments.tables_from_rows`).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import results
from allreduce_jax.training.experiments import tables_from_rows
from allreduce_jax.units import format_bytes

HERE = Path(__file__).resolve().parent
COLUMNS = [("ring", None), ("ring", "bf16"), ("ring", "int8"), ("two_shot", None),
           ("two_shot", "bf16"), ("two_shot", "int8")]  # fmt: skip


def error_table(rows: list[dict]) -> str:
  """One line per (measured or replayed, algorithm, wire), one column per p: the relative
  L2 error (× the closed-form model's where it has one)."""
  ps = sorted({r["p"] for r in rows})
  keys = sorted({(r["source"], r["algorithm"], r["wire"]) for r in rows})
  by = {(r["source"], r["algorithm"], r["wire"], r["p"]): r for r in rows}
  lines = [
    "| kind | algorithm | wire | " + " | ".join(f"p={p}" for p in ps) + " |",
    "|---|---|---|" + "---|" * len(ps),
  ]
  for k in keys:
    cells = []
    for p in ps:
      r = by.get((*k, p))
      if r is None:
        cells.append("")
        continue
      cell = f"{r['rel_error']:.2e}"
      if r.get("model"):
        cell += f" ({r['rel_error'] / r['model']:.2f}× model)"
      if r.get("replicas_identical") is False:
        cell += " NOT IDENTICAL"
      cells.append(cell)
    lines.append(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _ms(rows: list[dict]) -> dict:
  """``(algorithm, wire, bytes) -> ms`` of bench rows (the last where one repeats)."""
  return {(r["algorithm"], r.get("wire"), r["bytes"]): r["time_us"] / 1e3 for r in rows}


def inprocess_table(rows: list[dict]) -> list[str]:
  """Each wire format's time in one process on 8 emulated devices, ms."""
  t = _ms(rows)
  head = " | ".join(f"{a} {w or 'f32'}" for a, w in COLUMNS)
  lines = [f"| per participant | {head} | psum |", "|---|" + "---|" * (len(COLUMNS) + 1)]
  for n in sorted({k[2] for k in t}):
    cells = [f"{t[(a, w, n)]:.0f}" for a, w in COLUMNS] + [f"{t[('psum', None, n)]:.0f}"]
    lines.append(f"| {format_bytes(n)} | " + " | ".join(cells) + " |")
  return lines


def switch_table(rows: list[dict]) -> list[str]:
  """Each wire format's time on the switch, ms, and its speedup over the f32 ring."""
  t = _ms(rows)
  head = " | ".join(f"{a} {w or 'f32'}" for a, w in COLUMNS)
  lines = [f"| per participant | {head} |", "|---|" + "---|" * len(COLUMNS)]
  for n in sorted({k[2] for k in t}):
    ring = t[("ring", None, n)]
    cells = [f"{ring:.0f}"] + [
      f"{t[(a, w, n)]:.0f} ({ring / t[(a, w, n)]:.2f}×)" for a, w in COLUMNS[1:]
    ]
    lines.append(f"| {format_bytes(n)} | " + " | ".join(cells) + " |")
  return lines


def repeats_table(rows: list[dict]) -> list[str]:
  """The repeats at 16 MiB (each its own cluster; a run is four rows in file order): the
  int8 ring's and two_shot's speedup over the f32 ring of the same run."""
  lines = [
    "| run | ring f32 | ring int8 | speedup | two_shot int8 | speedup |",
    "|---|---|---|---|---|---|",
  ]
  for k in range(len(rows) // 4):
    t = _ms(rows[4 * k : 4 * k + 4])
    (n,) = {key[2] for key in t}
    ring, int8, two = t[("ring", None, n)], t[("ring", "int8", n)], t[("two_shot", "int8", n)]
    lines.append(
      f"| {k + 1} | {ring:.0f} | {int8:.0f} | {ring / int8:.2f}× | {two:.0f} | {ring / two:.2f}× |"
    )
  return lines


def audit_lines(rows: list[dict], wire: str) -> str:
  """How many of the audit's rows send exactly the schedule's permutes and bytes."""
  types = sorted({t for r in rows for t in r["payload_dtypes"]})
  return (f"- `{wire}`: {sum(r['match'] for r in rows)} of {len(rows)} rows match the schedule"
          f" (p = {', '.join(str(p) for p in sorted({r['p'] for r in rows}))}), every payload"
          f" {', '.join(f'`{t}`' for t in types)}, no all-reduce op:"
          f" {all(r['all_reduce_ops'] == 0 for r in rows)}.")  # fmt: skip


TIME = """\
# Compressed all-reduce: time (tables from the committed rows)

## In one process (`rows/inprocess8.jsonl`)

8 emulated CPU devices on 2 cores, medians of 5 (ms), measured with nothing else running.

{inprocess}

## A 4-host 200 Mbit/s switch (`rows/cluster_switch4_200Mbit.jsonl`)

4 hosts (one process, one device each) on one emulated switch, medians of 5 (ms; speedup over
the f32 ring in brackets), nothing else running.

{switch}

## Three more runs at 16 MiB (`rows/repeats_16MiB.jsonl`, each its own cluster, medians of 5)

{repeats}

## The audit (`rows/hlo_audit_*.jsonl`: `allreduce-jax audit --wire`)

{audit}
"""


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}`` of every table of this study."""
  bench = {name: results.read_rows(root / f"{name}.jsonl", "bench")
           for name in ("inprocess8", "cluster_switch4_200Mbit", "repeats_16MiB")}  # fmt: skip
  audit = [
    audit_lines(results.read_rows(root / f"hlo_audit_{w}.jsonl", "audit"), w)
    for w in ("int8", "bf16")
  ]
  out = {
    "rows/error_vs_p.md": error_table(results.read_rows(root / "error_vs_p.jsonl", "wire_error"))
    + "\n",
    "time.md": TIME.format(
      inprocess="\n".join(inprocess_table(bench["inprocess8"])),
      switch="\n".join(switch_table(bench["cluster_switch4_200Mbit"])),
      repeats="\n".join(repeats_table(bench["repeats_16MiB"])),
      audit="\n".join(audit),
    ),
  }
  for name, text in tables_from_rows(root / "training").items():
    out[f"rows/training/{name}"] = text
  return out


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
