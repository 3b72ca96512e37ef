"""ceiling.md from rows/tcp_ring_*.jsonl: the ring's steps in plain TCP on the emulated
switch, without JAX or gloo (``tcp_ring_ceiling.py``): the ceiling a lockstep ring reaches.

    python experiments/emulated_network/ceiling.py

One line per row: its busbw over the line rate (the median trial's, then the best trial's).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import results, units

HERE = Path(__file__).resolve().parent
FILES = {
  "tcp_ring_ceiling.jsonl": "the ring's steps alone",
  "tcp_ring_work.jsonl": "with the ring's float32 work between steps (`work`) and a one-byte"
  " 'ready to receive' before each send (`handshake`), one at a time",
}

TABLE = """\
## {what} (`{name}`)

| hosts | per host | link | TCP queue | congestion control | variant | repeat | busbw / line rate (median trial) | best trial |
|---|---|---|---|---|---|---|---|---|
{lines}
"""


def line(r: dict) -> str:
  """One row: its settings, then busbw over the line rate."""
  queue = units.format_bytes(r["tcp_queue"]) if r.get("tcp_queue") else "the kernel's (4 MiB)"
  variant = "+".join(k for k in ("work", "handshake") if r.get(k)) or "plain"
  return (
    f"| {r['hosts']} | {units.format_bytes(r['bytes'])} | {units.tc_rate(r['link_Bps'])} |"
    f" {queue} | {r.get('congestion_control') or 'default'} | {variant} |"
    f" {r.get('repeat', '—')} | {r['busbw_over_line']:.3f} | {r['busbw_over_line_best']:.3f} |"
  )


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  text = ["# The ring's steps in plain TCP (tables from the committed rows)\n"]
  for name, what in FILES.items():
    rows = results.read_rows(root / name, "tcp_ring")
    text.append(TABLE.format(what=what, name=name, lines="\n".join(map(line, rows))))
  return {"ceiling.md": "\n".join(text)}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
