"""Trust: the study's tables from its committed rows (no measurement here).

    python experiments/trust/tables.py

Reads ``rows/verify_new.jsonl`` (``allreduce-jax verify`` rows of Swing, the double
binary tree and near-first halving-doubling at p = 2..8) and ``rows/hlo_audit*.jsonl``
(``allreduce-jax audit``: the compiled HLO's collective-permutes and bytes against each
algorithm's closed-form schedule); writes ``tables.md`` beside this script.
"""

from __future__ import annotations

import json
from pathlib import Path

from allreduce_jax import results

HERE = Path(__file__).resolve().parent


def _rows(path: Path) -> list[dict]:
  return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def verify_table(rows: list[dict]) -> list[str]:
  lines = [
    "## verify: every case against the NumPy oracle",
    "",
    "| algorithm | p | cases | passed | bit-exact |",
    "|---|---|---|---|---|",
  ]
  for a in dict.fromkeys(r["algorithm"] for r in rows):
    mine = [r for r in rows if r["algorithm"] == a]
    ps = sorted({r["p"] for r in mine})
    passed = sum(bool(r["passed"]) for r in mine)
    exact = sum(bool(r.get("bit_exact")) for r in mine)
    lines.append(f"| {a} | {ps[0]}–{ps[-1]} | {len(mine)} | {passed} | {exact} |")
  return [*lines, ""]


def audit_table(name: str, rows: list[dict]) -> list[str]:
  off = [r for r in rows if not r["match"]]
  lines = [
    f"## {name}: the compiled HLO against the schedule",
    "",
    f"{len(rows) - len(off)} of {len(rows)} (algorithm, p) cells send exactly the schedule's"
    f" collective-permutes and bytes ({rows[0]['bytes']} bytes per participant), every one"
    f" without an all-reduce op: {all(r['all_reduce_ops'] == 0 for r in rows)}.",
  ]
  for r in off:
    lines.append(
      f"- {r['algorithm']} at p = {r['p']}: {r['permutes']} permutes (schedule"
      f" {r['permutes_model']}), most bytes sent {r['max_sent_bytes']} against"
      f" {r['max_sent_bytes_model']:.1f} ({r['max_sent_bytes'] / r['max_sent_bytes_model']:.4f}×:"
      " the buffer padded to a multiple of 2p)."
    )
  return [*lines, ""]


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  lines = ["# Trust (tables from the committed rows)", ""]
  lines += verify_table(_rows(root / "verify_new.jsonl"))
  for path in sorted(root.glob("hlo_audit*.jsonl")):
    lines += audit_table(path.name, _rows(path))
  return {"tables.md": "\n".join(lines)}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
