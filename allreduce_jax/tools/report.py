"""``allreduce-jax report``: run every experiment and write ``results/report/REPORT.md``.

The report is thin over the subcommands: each section runs one of them (verify, the
HLO audit, bench + fit, auto, fusion, scaling, training, a bench on an emulated
network when the machine allows it) with its output under the
report folder, keeps what it printed, and links the figures it drew. The markdown is
rewritten after every section, and every sweep resumes from its JSON Lines file, so
an interrupted report picks up where it stopped (``--fresh`` starts over). The
markdown opens with what the run found (:func:`findings`: three sentences computed
from the rows), then the claims it judges (:func:`claims`) and the measurements it
reports without a threshold (:func:`measurements`). ``--redraw`` draws every figure
and the markdown again from the rows of a report folder, measuring nothing
(:func:`redraw`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
from tqdm import tqdm

from allreduce_jax import ALGORITHMS, cost_model, gloo_model, names, netns, results, units
from allreduce_jax.devices import inner_size, use_cpu_devices
from allreduce_jax.results import load_json, save_json, upgrade
from allreduce_jax.tools import dispatch, plot
from allreduce_jax.tools._args import add_devices, csv_list, output_dir
from allreduce_jax.tools.bench import fit_params_table, fit_report
from allreduce_jax.tools.scaling import crossovers
from allreduce_jax.training import figures as train_figures
from allreduce_jax.training.tables import compression_table
from allreduce_jax.units import format_bytes


@dataclass
class Section:
  """One part of the report: the commands run, what they printed, their figures."""

  key: str
  title: str
  intro: str
  commands: list[list[str]]
  text: str = ""
  figures: list[str] = field(default_factory=list)
  seconds: float = 0.0
  status: int | None = None


class _Tee(io.TextIOBase):
  """Writes to the terminal and keeps a copy."""

  def __init__(self, stream):
    self.stream, self.buffer = stream, io.StringIO()

  def write(self, s):
    self.stream.write(s)
    self.stream.flush()
    return self.buffer.write(s)

  def flush(self):
    self.stream.flush()


def results_dir(*parts: str) -> Path:
  """Where results go, plus ``parts`` (created if missing; the notebooks write here):
  ``$ALLREDUCE_JAX_RESULTS`` if set; else, in a source checkout (an editable install,
  ``pyproject.toml`` beside the package), the checkout's ``results/`` whatever the
  working directory; else (an installed wheel) ``results/`` under the working
  directory, never inside ``site-packages``."""
  env = os.environ.get("ALLREDUCE_JAX_RESULTS")
  checkout = Path(__file__).resolve().parents[2]
  if env:
    root = Path(env)
  elif (checkout / "pyproject.toml").exists() and (checkout / "allreduce_jax").is_dir():
    root = checkout / "results"
  else:
    root = Path.cwd() / "results"
  path = root.joinpath(*parts)
  path.mkdir(parents=True, exist_ok=True)
  return path


#: Each experiment's settings, full and smoke: the one definition of their sizes.
#: :func:`plan` turns them into the commands the report runs; the notebooks read them
#: with :func:`settings`. Option names are the subcommands' (``min_bytes`` ->
#: ``--min-bytes``; True: a flag).
EXPERIMENTS: dict[str, dict[str, dict]] = {
  "verify": {
    "full": {"shapes": "scalar,13,3x7"},
    "smoke": {
      "ops": "sum,max",
      "dtypes": "float32,int32",
      "shapes": "13",
      "kinds": "verifiable,random",
    },
  },
  "audit": {
    "full": {"ps": "2,4,8,16,32", "bytes": 1 << 16},
    "smoke": {"ps": "2,4", "bytes": 1 << 16},
  },
  "bench": {
    "full": {"min_bytes": "1KiB", "max_bytes": "16MiB", "factor": 4, "iters": 7, "warmup": 3},
    "smoke": {
      "min_bytes": "1KiB",
      "max_bytes": "8KiB",
      "factor": 8,
      "iters": 3,
      "warmup": 1,
      "no_uneven": True,
    },
  },
  "fusion": {
    "full": {"layers": 16, "d_model": 128, "iters": 5, "warmup": 2},
    "smoke": {
      "layers": 2,
      "d_model": 16,
      "iters": 3,
      "warmup": 1,
      "buckets": "per-leaf,64KiB,one",
    },
  },
  "scaling": {"full": {"max_p": 16384}, "smoke": {"max_p": 64}},
  # The replay on networks: every algorithm's messages routed on a switch, a 3-D torus
  # and a 7:1 fat tree (to 1024 participants: 16384 takes over 10 minutes here).
  "scaling_topology": {
    "full": {
      "topology": ["switch", "torus:3d", "fat_tree:8:7"],
      "sizes": "1MiB,256MiB",
      "max_p": 1024,
    },
    "smoke": {"topology": ["switch", "torus:3d", "fat_tree:8:7"], "sizes": "1MiB", "max_p": 64},
  },
  "train": {"full": {}, "smoke": {"smoke": True}},
  # Table C again with a 100 M-parameter model priced on its network (the README's
  # sync-vs-async headline): at the real size (9,610 parameters) communication is
  # negligible and the asynchronous parameter server is fastest.
  "train_table_c_100m": {
    "full": {"model_params": 100_000_000},
    "smoke": {"smoke": True, "model_params": 100_000_000},
  },
  "network": {
    "full": {"hosts": 4, "link": "200Mbit", "min_bytes": "1MiB", "max_bytes": "16MiB"},
    "smoke": {"hosts": 2, "link": "200Mbit", "min_bytes": "1MiB", "max_bytes": "1MiB"},
  },
  # Compressed all-reduce: each wire format's error and bytes next to the exact program,
  # and Table C's compressed arms next to sync.
  "compression": {
    "full": {"min_bytes": "64KiB", "max_bytes": "4MiB", "factor": 8, "iters": 5, "warmup": 1},
    "smoke": {"min_bytes": "64KiB", "max_bytes": "64KiB", "factor": 4, "iters": 2, "warmup": 1},
  },
  "compression_train": {
    "full": {
      "arms": "sync,sync_bf16,sync_int8,sync_int8_two_shot,powersgd_r1,powersgd_r4,"
      "powersgd_r4_noef,topk1,topk1_noef"
    },
    "smoke": {"smoke": True, "arms": "sync,sync_int8_two_shot,powersgd_r4,topk1"},
  },
  "train_phase": {
    "full": {"sigmas": "0,0.5,1.5", "bandwidths": "0.1GB/s,1GB/s,10GB/s,100GB/s,1000GB/s"},
    "smoke": {"smoke": True},
  },
}


def settings(experiment: str, smoke: bool = False) -> dict:
  """One experiment's settings (a copy), e.g. ``settings("bench", smoke=True)["iters"]``.

  Example:
    >>> settings("bench")["max_bytes"], settings("bench", smoke=True)["max_bytes"]
    ('16MiB', '8KiB')
  """
  return dict(EXPERIMENTS[experiment]["smoke" if smoke else "full"])


def _flags(options: dict) -> list[str]:
  """``{"min_bytes": "1KiB", "smoke": True}`` -> ``["--min-bytes", "1KiB", "--smoke"]``."""
  argv: list[str] = []
  for name, value in options.items():
    flag = "--" + name.replace("_", "-")
    if isinstance(value, list):  # a repeated option
      for v in value:
        argv += [flag, str(v)]
    elif value is True:
      argv.append(flag)
    elif value is not False and value is not None:
      argv += [flag, str(value)]
  return argv


def algorithms(experiment: str) -> list[str]:
  """The algorithms an experiment runs, derived from the registry records: bench
  times every algorithm with a cost schedule; auto runs against its candidates and
  the reference; fusion buckets the ring and the reference.

  Example:
    >>> algorithms("auto")[0], "psum" in algorithms("bench")
    ('auto', True)
  """
  reference = list(names(hand_written=False, axes=1))
  if experiment == "bench":
    return list(names(priced=True))
  if experiment == "auto":
    return ["auto", *names(auto=True), *reference]
  if experiment == "fusion":
    return ["ring", *reference]
  raise ValueError(f"no algorithm list for experiment {experiment!r}")


def plan(out: Path, smoke: bool, devices: int) -> list[Section]:
  """The sections and the exact commands behind them, from :data:`EXPERIMENTS`."""
  d = str(devices)
  o = out.as_posix()

  def opts(key: str) -> list[str]:
    return _flags(settings(key, smoke))

  bench_sizes = [a for a in opts("bench")]
  net = settings("network", smoke)
  return [
    Section("verify", "Verification against a NumPy oracle",
            "Every algorithm × op × dtype is compared with a NumPy oracle (`allreduce_jax._ops.oracle`), not with XLA's collective: on verifiable inputs (integer-valued and rank-coded, so every sum is exact in any order: the result must equal the oracle bit for bit, `mean` within 2 ulp), on random inputs (within the floating-point summation bound) and on special inputs (NaN on one participant and on all, ±inf, `+inf` with `-inf`, `-0.0` with `+0.0`; NaN propagates through max/min as in `numpy.maximum.reduce`). Every participant's result must be bitwise identical. XLA's `psum`/`pmean`/`pmax`/`pmin` run beside each algorithm on the same input; where they differ from the oracle (XLA:CPU's `pmax`/`pmin` skip NaN) that is a *backend finding*, not a failure.",
            # --fresh: verify appends its cases; a second report would count them twice
            [["verify", "--devices", d, *opts("verify"), "--out", f"{o}/verify.jsonl", "--fresh"]]),
    Section("audit", "Communication audit from compiled HLO",
            "Each algorithm is compiled (never run) at each participant count p; the `collective-permute` ops and the bytes each participant sends are read from the HLO and compared with the closed-form schedule of `cost_model`.",
            [["audit", *opts("audit"), "--out", f"{o}/hlo_audit.jsonl"]]),
    Section("bench", "Bus bandwidth (nccl-tests conventions) and the fitted α-β-γ model",
            "At each size every algorithm is compiled apart and timed round robin (the median of the timed calls; bars: min–max), each result checked against `lax.psum`. As in nccl-tests, algbw = n/t and busbw = algbw·2(p−1)/p. The α-β-γ model is then fitted to these rows (`--fit`).",
            [["bench", "--devices", d, "--algorithms", ",".join(algorithms("bench")), *bench_sizes,
              "--out", f"{o}/bench.jsonl", "--fit", "--params", f"{o}/cost_params.json"]]),
    Section("auto", "auto: the model's choice, measured side by side",
            "`algorithm=\"auto\"` picks, at trace time, the candidate with the smallest predicted time under the parameters fitted above; here it is timed next to every candidate.",
            [["bench", "--devices", d, "--algorithms", ",".join(algorithms("auto")),
              *bench_sizes, "--out", f"{o}/bench_auto.jsonl"]]),
    Section("fusion", "Tensor fusion: per-leaf vs bucketed",
            "Each all-reduce pays its latency term whatever its size, so a gradient pytree reduced leaf by leaf pays it once per leaf. Here the training CNN's gradient (6 leaves) and a GPT-like transformer's (hundreds of leaves) are all-reduced per leaf and in buckets, side by side.",
            [["fusion", "--devices", d, "--algorithms", ",".join(algorithms("fusion")), *opts("fusion"),
              "--out", f"{o}/fusion.jsonl"]]),
    Section("scaling", "Scaling to thousands of participants: the network decides",
            "No collective runs here. The flat α-β model gives every message its own link, so it cannot tell the ring, halving-doubling and Swing apart (all send 2(p−1)/p·n bytes). The replay routes each algorithm's real message steps on a network (a switch, a 3-D torus, a 7:1 oversubscribed fat tree; 5 µs and 50 GB/s per link, `ib_ndr`) and charges each step its busiest link, so distance and link sharing decide: the table says which algorithm wins at the largest p on each network, and how far the flat model is from the replay. Then the two-level model (nodes of 8 devices on NVLink joined by InfiniBand, documented presets; with this run's fit when the bench section ran) for the ring's crossover.",
            [["scaling", *opts("scaling_topology"), "--out", f"{o}/scaling_topology.jsonl"],
             ["scaling", *opts("scaling"), "--out", f"{o}/scaling.jsonl"]]),
    Section("train", "Synchronous data-parallel training, asynchronous SGD, stragglers",
            "Flax NNX on scikit-learn digits: synchronous data-parallel SGD over the hand-written ring, and simulated asynchronous SGD on stale gradients (fixed staleness τ, then straggling workers with and without backup workers). Table C puts every arm (sync, backups, batch ∝ speed, slow-node isolation, async, SSP, Local SGD, DiLoCo, gossip) on one clock, compute plus communication priced by the cost model, at the model's real size and again with a 100 M-parameter model priced (the summary's two sync-vs-async claims); the phase diagram shows which arm reaches the target first by straggler heaviness × link bandwidth for a 100 M-parameter model.",
            [["train", "sync", *opts("train"), "--devices", d, "--out", f"{o}/train/sync"],
             ["train", "staleness", *opts("train"), "--devices", d, "--out", f"{o}/train/staleness"],
             ["train", "stragglers", *opts("train"), "--devices", d, "--out", f"{o}/train/stragglers"],
             ["train", "table-c", *opts("train"), "--devices", d, "--out", f"{o}/train/table_c"],
             ["train", "table-c", *opts("train_table_c_100m"), "--devices", d,
              "--out", f"{o}/train/table_c_100m"],
             ["train", "phase", *opts("train_phase"), "--devices", d, "--out", f"{o}/train/phase"]]),
    Section("compression", "Compressed all-reduce: the error, the bytes, and training with it",
            "The ring and the quantize-once `two_shot` all-reduce in bfloat16 (its bits as `uint16`) and block-absmax int8 (one float32 scale per 256 elements, in the same message) on the wire, timed next to the exact program, with the relative L2 error of each result against `psum`'s (bench's inputs are small integers, which bf16 carries exactly: its error here is 0; `experiments/compression/` has the error on normal inputs by p). Then Table C's compressed arms (the all-reduce in bf16 or int8, PowerSGD, top-k 1 %, with and without error feedback) next to exact sync on the same seeds: final metric, its difference from sync and the bytes per training sample on the wire. The codecs' compute is not priced in the simulated times.",
            [["bench", "--devices", d, "--algorithms", COMPRESSION_ALGORITHMS, "--wires", "none,bf16,int8",
              *opts("compression"), "--no-uneven", "--out", f"{o}/compression/bench.jsonl"],
             ["train", "table-c", *opts("compression_train"), "--devices", d,
              "--out", f"{o}/compression/table_c"]]),
    Section("network", "On a real network: an emulated cluster with shaped links",
            f"{net['hosts']} hosts (network namespaces, one process and one device each) on one switch, every host link shaped to {net['link']} each way with `tc`; gloo carries the data over the emulated links. Each algorithm is timed in its own block (`--order blocks`: after a round robin one algorithm's traffic slowed the next one's calls) and each row is the slowest process's median (`-a 3`). Each time is set against its bound from the link rate (less the TCP/IP headers), replayed as XLA:CPU and gloo run it: one ppermute at a time, a pairwise exchange one direction at a time (`allreduce_jax.gloo_model`). Built as root on the machine, or without root in a user namespace of the user's own (rootless); skipped, with the reason, where neither is possible. The model column of the console output is bench's usual α-β-γ fit of this machine's in-process devices, not a model of this network (it sits tens of times below these times): the bounds in the table are.",
            [["cluster", "--hosts", str(net["hosts"]), "--topology", "switch", "--link", net["link"],
              "--timeout", "1800", "--", "bench", "--algorithms", NETWORK_ALGORITHMS,
              "--min-bytes", net["min_bytes"], "--max-bytes", net["max_bytes"], "--factor", "4",
              "--iters", "3", "--warmup", "1", "--no-uneven", "--order", "blocks", "-a", "3",
              "--out", f"{o}/network/bench.jsonl"]]),
  ]  # fmt: skip


#: What the compression section times in every wire format.
COMPRESSION_ALGORITHMS = "ring,two_shot,psum"

#: What the network section times: the ring, the exchange-based and root-based
#: schedules, and gloo's own all-reduce.
NETWORK_ALGORITHMS = "ring,halving_doubling,recursive_doubling,tree,naive,psum"


def _network_skip() -> str | None:
  """Why the network section cannot run here (None if it can)."""
  return netns.privilege_problem()


def _run_command(argv: list[str]) -> int:
  return dispatch.run(argv)


def environment() -> dict:
  versions = {}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy"):
    try:
      versions[name] = __import__(name).__version__
    except Exception:  # pragma: no cover
      versions[name] = "?"
  return {
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    "python": platform.python_version(),
    **versions,
    "backend": jax.default_backend(),
    "devices": jax.device_count(),
    "processes": jax.process_count(),
    "cpu_cores": os.cpu_count(),
    "machine": f"{platform.system()} {platform.machine()}",
    "commit": results.source_commit(),
  }


# ----------------------------------------------------------------------------------------
# Rendering: the summary, then one section per experiment, from the rows on disk.
# ----------------------------------------------------------------------------------------


def _rows(path: Path) -> list[dict]:
  """The JSON objects of a JSON Lines file (none if it is missing; bad lines skipped),
  renamed fields under their current names (``results.upgrade``)."""
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(row, dict):
      rows.append(upgrade(row))
  return rows


def num(x, digits: int = 3) -> str:
  """A rounded number for a table: 3 significant digits, thousands separated, "—" for
  a missing value.

  Example:
    >>> num(32.12119005000001), num(0.000123456), num(123456.7), num(None)
    ('32.1', '0.000123', '123,457', '—')
  """
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "—"
  if isinstance(x, bool):
    return "yes" if x else "no"
  if isinstance(x, int):
    return f"{x:,}"
  if x == 0:
    return "0"
  if abs(x) >= 10 ** (digits - 1):
    return f"{x:,.0f}"
  return f"{x:.{digits}g}"


def to_markdown(rows: list[dict], columns: dict[str, str] | None = None) -> str:
  """A markdown table of ``rows`` (numbers through :func:`num`); ``columns`` maps a
  row key to its header (default: every key of the first row)."""
  if not rows:
    return "*no rows*"
  columns = columns or {k: k for k in rows[0]}

  def cell(v) -> str:
    text = v if isinstance(v, str) else num(v)
    return text.replace("|", "\\|").replace("\n", " ")

  lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
  for r in rows:
    lines.append("| " + " | ".join(cell(r.get(k)) for k in columns) + " |")
  return "\n".join(lines)


def _details(summary: str, body: str) -> list[str]:
  return ["<details>", f"<summary>{summary}</summary>", "", body, "", "</details>", ""]


def _fit(out: Path):
  path = out / "cost_params.json"
  try:
    return cost_model.load_params(path) if path.exists() else None
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _render_verify(out: Path) -> list[str]:
  rows = _rows(out / "verify.jsonl")
  if not rows:
    return []
  failed = [r for r in rows if not r["passed"]]
  exact = [r for r in rows if r.get("input_kind") == "verifiable"]
  ps = sorted({r["p"] for r in rows})
  findings = [r for r in rows if r.get("backend")]
  md = [
    f"**{len(rows):,} cases** compared with the NumPy oracle (p = {', '.join(map(str, ps))}): "
    f"**{len(rows) - len(failed):,} passed, {len(failed):,} failed**; "
    + (
      f"bit-exact on {sum(r['bit_exact'] for r in exact):,} of {len(exact):,} verifiable cases."
      if any("input_kind" in r for r in rows)
      else "these rows predate the `input_kind` field, so verifiable cases cannot be told apart."
    ),
    "",
    f"XLA's own collective differed from the oracle in {len(findings):,} of {len(rows):,} cases"
    " (backend findings, listed in the console output; not failures).",
    "",
    "Cases passed per algorithm and dtype (all ops, input kinds and shapes):",
    "",
  ]
  dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
  pivot = []
  for alg in dict.fromkeys(r["algorithm"] for r in rows):
    line = {"algorithm": alg}
    for dt in dtypes:
      mine = [r for r in rows if r["algorithm"] == alg and r["dtype"] == dt]
      ok = sum(r["passed"] for r in mine)
      line[dt] = f"{'✓' if ok == len(mine) else '✗'} {ok}/{len(mine)}"
    pivot.append(line)
  md += [to_markdown(pivot, {"algorithm": "algorithm", **{d: d for d in dtypes}}), ""]
  if failed:
    keys = ("algorithm", "op", "dtype", "p", "kind", "max_abs_err", "tolerance")
    md += _details(f"failed cases ({len(failed)})", to_markdown(failed, {k: k for k in keys}))
  return md


def _render_audit(out: Path) -> list[str]:
  rows = _rows(out / "hlo_audit.jsonl")
  if not rows:
    return []
  ps = sorted({r["p"] for r in rows})
  table = []
  for alg in dict.fromkeys(r["algorithm"] for r in rows):
    mine = {r["p"]: r for r in rows if r["algorithm"] == alg}
    top = mine[max(mine)]
    ok = all(r["match"] and not r["all_reduce_ops"] for r in mine.values())
    table.append(
      {
        "algorithm": alg,
        f"collective-permutes at p = {', '.join(map(str, ps))}": ", ".join(
          str(mine[p]["permutes"]) if p in mine else "—" for p in ps
        ),
        f"bytes sent per participant / n at p = {ps[-1]}": top["sent_over_n"],
        f"compile (s) at p = {ps[-1]}": top["compile_s"],
        "HLO = schedule": "✓" if ok else "✗",
      }
    )
  return [to_markdown(table), ""]


def _bench_table(rows: list[dict], fitted) -> list[dict]:
  """One line per bench row, keyed by column header; with a fit, the fitted model's
  prediction (never the documented defaults the row was measured next to)."""

  reference = {a for a in ALGORITHMS if not ALGORITHMS[a].hand_written}
  psum = {r["bytes"]: r["busbw_GBps"] for r in rows if r["algorithm"] in reference}
  table = []
  for r in sorted(rows, key=lambda r: (r["bytes"], r["time_us"])):
    record = ALGORITHMS.get(r["algorithm"])
    line = {
      "size / participant": format_bytes(r["bytes"]),
      "algorithm": r["algorithm"] + (f" → {r['chosen']}" if r.get("chosen") else ""),
      "time (µs)": r["time_us"],
      "min–max (µs)": f"{num(r['time_us_min'])}–{num(r['time_us_max'])}",
      "algbw (GB/s)": r["algbw_GBps"],
      "busbw (GB/s)": r["busbw_GBps"],
      "busbw / psum's": r["busbw_GBps"] / psum[r["bytes"]] if psum.get(r["bytes"]) else None,
      "#wrong": r["wrong"],
    }
    if fitted is not None:
      priced = record is not None and record.schedule is not None
      inner = inner_size(r["algorithm"], r["n_devices"]) if priced else None
      line["fitted model (µs)"] = (
        cost_model.predict_us(r["algorithm"], r["n_devices"], r["bytes"], fitted, inner=inner)
        if priced
        else None
      )
    table.append(line)
  return table


def _render_bench(out: Path) -> list[str]:
  rows = _rows(out / "bench.jsonl")
  if not rows:
    return []
  fitted = _fit(out)
  p = rows[0]["n_devices"]
  top = max(r["bytes"] for r in rows)
  table = _bench_table(rows, fitted)
  md = [
    f"{len(rows)} rows on {p} devices. At the largest size, {format_bytes(top)} per participant:",
    "",
  ]
  md += [to_markdown([t for t in table if t["size / participant"] == format_bytes(top)]), ""]
  if fitted is not None:
    fits = fit_params_table(fitted)
    md += [
      "The fitted parameters (shared: every hand-written algorithm's rows together; then one fit"
      " per algorithm). γ is shown as — where the rows cannot identify it: for one algorithm at"
      " one p the bytes reduced are a fixed multiple of the bytes sent, so γ is not separable"
      " from β, and β includes it.",
      "",
      to_markdown(
        fits,
        {
          "fit": "fit",
          "alpha_us": "α (µs / step)",
          "beta_ns_per_byte": "β (ns / B)",
          "bandwidth_GBps": "1/β (GB/s)",
          "gamma_ns_per_byte": "γ (ns / B reduced)",
        },
      ),
      "",
    ]
  md += _details(f"every size ({len(table)} rows)", to_markdown(table))
  return md


def _render_network(out: Path) -> list[str]:
  skipped = out / "network" / "skipped.txt"
  if skipped.exists():
    return [f"*Skipped on this machine: {skipped.read_text().strip()}*", ""]
  rows = [r for r in _rows(out / "network" / "bench.jsonl") if r.get("wrong") == 0]
  if not rows:
    return []
  state = (
    json.loads((out / "sections.json").read_text()) if (out / "sections.json").exists() else {}
  )
  argv = (state.get("network") or {}).get("commands", [[]])[0]
  link = argv[argv.index("--link") + 1] if "--link" in argv else "200Mbit"
  rate = units.parse_rate(link)
  try:  # the cluster's network, as every row's key carries it
    net = json.loads(rows[0]["key"]).get("network") or {}
  except (KeyError, TypeError, ValueError):
    net = {}
  params = gloo_model.link_params(rate, 0.0, int(net.get("mtu", 1500)))
  top = gloo_model.emulated("switch")
  table = []
  for r in sorted(rows, key=lambda r: (r["bytes"], r["time_us"])):
    p, n, t = r["n_devices"], r["bytes"], r["time_us"] * 1e-6
    ran = r.get("choices")  # the schedule as it traced (the double tree's chunk count)
    half = gloo_model.predict_seconds(r["algorithm"], p, n, params, top, "half", choices=ran)
    full = gloo_model.predict_seconds(r["algorithm"], p, n, params, top, "full", choices=ran)
    table.append({
      "algorithm": r["algorithm"], "size / participant": format_bytes(n), "time (s)": t,
      "busbw / line rate": n * 2 * (p - 1) / p / t / rate,
      "bound, half duplex (s)": half, "measured / bound": t / half,
      "bound, full duplex (s)": full,
    })  # fmt: skip
  queues = (
    f" Each link's queue holds {net['queue_s'] * 1e3:g} ms of traffic, frames of"
    f" {net['mtu']} bytes, at most {format_bytes(net['tcp_queue'])} queued in a host per TCP"
    " socket (`cluster --tcp-queue`)."
    if {"queue_s", "mtu", "tcp_queue"} <= set(net)
    else ""
  )
  # The hosts' TCP congestion control: asked for (in the key) or this machine's default.
  cc = net.get("congestion_control") or netns.default_congestion_control()
  queues += f" TCP congestion control {cc} (`cluster --congestion-control`)." if cc else ""
  return [
    f"{rows[0]['n_devices']} hosts, links {link} ({rate / 1e6:g} MB/s) each way.{queues} The"
    " bounds are the replayed bytes at the link rate less the frames' TCP/IP headers"
    " (`gloo_model.payload_share`), α = 0; the half-duplex one as XLA:CPU and gloo run"
    " them: one ppermute at a time, an exchange's two directions in turn. They are the"
    " bounds of one call on idle links. A row a little below its bound (the root-based"
    " naive, halving-doubling) did not beat the links: each process times its calls back"
    " to back with no barrier between them, so a process that has its result"
    " starts the next call while the others finish this one, and where this call leaves a"
    " direction of a link idle the next one's first bytes travel in it (into the sockets'"
    " and the links' queues); a link idle for a moment also passes its token bucket (4 ms of"
    " its rate) at once.",
    "",
    to_markdown(table),
    "",
  ]


def _render_auto(out: Path) -> list[str]:
  rows = _rows(out / "bench_auto.jsonl")
  if not rows:
    return []

  table = []
  for n in sorted({r["bytes"] for r in rows}):
    at = {r["algorithm"]: r for r in rows if r["bytes"] == n}
    custom = [r for a, r in at.items() if a in ALGORITHMS and ALGORITHMS[a].auto]
    if "auto" not in at or not custom:
      continue
    best = min(custom, key=lambda r: r["time_us"])
    table.append(
      {
        "size / participant": format_bytes(n),
        "auto picks": at["auto"].get("chosen") or "—",
        "auto (µs)": at["auto"]["time_us"],
        "fastest measured": best["algorithm"],
        "its time (µs)": best["time_us"],
        "auto / fastest": at["auto"]["time_us"] / best["time_us"],
      }
    )
  return [to_markdown(table), ""]


def _render_fusion(out: Path) -> list[str]:
  rows = _rows(out / "fusion.jsonl")
  if not rows:
    return []
  short = []
  for key in dict.fromkeys((r["model"], r["algorithm"]) for r in rows):
    mine = [r for r in rows if (r["model"], r["algorithm"]) == key]
    per_leaf = next((r for r in mine if r["bucket"] == "per-leaf"), None)
    best = min(mine, key=lambda r: r["time_us"])
    short.append(
      {
        "gradient pytree": f"{key[0]} ({mine[0]['n_leaves']} leaves, {mine[0]['bytes'] / 2**20:.2f} MiB)",
        "algorithm": key[1],
        "per-leaf (ms)": per_leaf["time_us"] / 1e3 if per_leaf else None,
        "fastest bucketing": f"{best['bucket']} ({best['n_buckets']} all-reduces)",
        "its time (ms)": best["time_us"] / 1e3,
        "speedup ×": best.get("speedup_vs_per_leaf"),
      }
    )
  full = [
    {"model": r["model"], "algorithm": r["algorithm"], "bucket": r["bucket"],
     "all-reduces": r["n_buckets"], "time (ms)": r["time_us"] / 1e3,
     "speedup ×": r.get("speedup_vs_per_leaf"), "#wrong": r["wrong"]}
    for r in rows
  ]  # fmt: skip
  return [
    to_markdown(short),
    "",
    *_details(f"every bucket size ({len(full)} rows)", to_markdown(full)),
  ]


def replay_winners(rows: list[dict]) -> list[dict]:
  """Per (network, size) at its largest p: the replay's best algorithm and the flat
  model's, and far-first halving-doubling's replayed time over its flat time."""
  out = []
  for net, n in sorted({(r["scenario"], r["bytes"]) for r in rows}):
    mine = [r for r in rows if (r["scenario"], r["bytes"]) == (net, n)]
    p = max(r["p"] for r in mine)
    at = {r["algorithm"]: r for r in mine if r["p"] == p}
    best = min(at.values(), key=lambda r: r["predicted_us"])
    flat = min(at.values(), key=lambda r: r["flat_us"])
    hd = at.get("halving_doubling")
    out.append({
      "network": net, "size / participant": format_bytes(n), "p": p,
      "best (replay)": best["algorithm"], "its time (µs)": best["predicted_us"],
      "best (flat model)": flat["algorithm"],
      "ring / best": at["ring"]["predicted_us"] / best["predicted_us"] if "ring" in at else None,
      "HD far-first: replay / flat": hd["over_flat"] if hd else None,
    })  # fmt: skip
  return out


def _render_scaling(out: Path) -> list[str]:
  md: list[str] = []
  replayed = _rows(out / "scaling_topology.jsonl")
  if replayed:
    md += ["**Replayed on networks** (at each network's largest p):", ""]
    md += [to_markdown(replay_winners(replayed)), ""]
  rows = _rows(out / "scaling.jsonl")
  if not rows:
    return md
  md += ["**Two-level model** (NVLink nodes on InfiniBand; flat α-β within each level):", ""]
  table = [
    {
      "machine": c["scenario"],
      "size / device": format_bytes(c["bytes"]),
      "ring within 5 % of the best up to p": c["ring_competitive_until"] or "never",
      "ring loses from p": c["ring_loses_at"] or "—",
      "to": c["winner_there"],
      "ring / best at the largest p": c["ring_over_best_at_max_p"],
      "best there": c["best_at_max_p"],
      "largest p": c["max_p"],
    }
    for c in crossovers(rows)
  ]
  return [*md, to_markdown(table), ""]


def _render_train(out: Path) -> list[str]:
  md: list[str] = []
  sync = [r for path in sorted((out / "train").glob("sync/*.jsonl")) for r in _rows(path)]
  accs = [r["final_test_acc"] for r in sync if r.get("final_test_acc") is not None]
  if accs:
    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
    md += [
      f"Synchronous data-parallel SGD over the ring: final test accuracy"
      f" **{statistics.mean(accs):.1%}** ± {sd:.1%} over {len(accs)} run(s).",
      "",
    ]
  for table in sorted((out / "train").rglob("*.md")):
    lines = [
      "#### " + line.lstrip("#").strip() if line.startswith("#") else line
      for line in table.read_text().splitlines()
    ]
    rows = sum(line.startswith("|") for line in lines) - 2
    body = "\n".join(lines).strip()
    md += (
      _details(f"{table.relative_to(out).as_posix()} ({rows} rows)", body)
      if rows > 12
      else [body, ""]
    )
  return md


def _render_compression(out: Path) -> list[str]:
  md: list[str] = []
  rows = [r for r in _rows(out / "compression" / "bench.jsonl") if r.get("algorithm")]
  if rows:
    top = max(r["bytes"] for r in rows)
    exact = {
      r["algorithm"]: r for r in rows if r["bytes"] == top and r.get("wire") in (None, "none")
    }
    table = []
    for r in sorted(
      (r for r in rows if r["bytes"] == top), key=lambda r: (r["algorithm"], r.get("wire") or "")
    ):
      ref = exact.get(r["algorithm"])
      per = r.get("wire_bytes_per_element")
      ref_per = ref.get("wire_bytes_per_element") if ref else None
      table.append({
        "algorithm": r["algorithm"],
        "wire": r.get("wire") or "none (exact)",
        "rel. L2 error vs psum": r.get("rel_error"),
        "B / element sent": per,
        "× exact's bytes": per / ref_per if per and ref_per else None,
        "time (µs)": r["time_us"],
        "× exact's time": r["time_us"] / ref["time_us"] if ref else None,
      })  # fmt: skip
    md += [
      f"{len(rows)} rows on {rows[0]['n_devices']} devices; at {format_bytes(top)} per"
      " participant (bytes per element: the busiest sender's, scales included):",
      "",
      to_markdown(table),
      "",
    ]
  table_c = [r for r in _rows(out / "compression" / "table_c" / "table_c.jsonl") if "arm" in r]
  if table_c:
    md += [
      "Training (Table C's setup; Δ paired by seed: the same initial weights, data order and"
      " compute times):",
      "",
      compression_table(table_c),
      "",
    ]
  return md


RENDER = {
  "verify": _render_verify,
  "audit": _render_audit,
  "bench": _render_bench,
  "auto": _render_auto,
  "fusion": _render_fusion,
  "scaling": _render_scaling,
  "train": _render_train,
  "compression": _render_compression,
  "network": _render_network,
}


#: The result of a claim the smoke report measures but cannot judge (see ``claims``).
NOT_JUDGED = "— not judged at smoke size"


def _claim(text: str, value: str, threshold: str, passed: bool, judged: bool = True) -> dict:
  return {
    "claim": text,
    "measured": value,
    "threshold": threshold,
    "result": ("✓ pass" if passed else "✗ fail") if judged else NOT_JUDGED,
  }


def _time_to_target(path: Path) -> tuple[dict[str, float], dict]:
  """Per Table C arm, the median time to target over seeds (inf: never reached),
  and one row (for the setup it ran under)."""
  rows = [r for r in _rows(path) if "arm" in r]
  ttt = {}
  for arm in dict.fromkeys(r["arm"] for r in rows):
    ts = [r["time_to_target"] for r in rows if r["arm"] == arm]
    ttt[arm] = statistics.median(math.inf if t is None else t for t in ts)
  return ttt, (rows[0] if rows else {})


def claims(out: Path, smoke: bool = False) -> list[dict]:
  """The summary: each claim with its measured number, its threshold and pass/fail,
  read back from the rows this report wrote (a claim whose rows are missing is left out).

  With ``smoke``, a claim about wall-clock speed at sizes where the smoke run's few
  timed calls of a few KiB cannot decide it (``auto`` against the fastest algorithm:
  tens of µs, within the machine's jitter) shows its measurement and
  :data:`NOT_JUDGED`, neither pass nor fail."""
  found = []
  verify = _rows(out / "verify.jsonl")
  timed = [r for f in ("bench.jsonl", "bench_auto.jsonl", "fusion.jsonl") for r in _rows(out / f)]
  if verify or timed:
    failed = sum(not r["passed"] for r in verify)
    wrong = sum(int(r.get("wrong", 0)) for r in timed)
    found.append(_claim(
      "Every algorithm returns the NumPy oracle's result (verify), and every timed result equals lax.psum's (bench)",
      f"{failed} of {len(verify):,} verify cases failed; {wrong} wrong elements in {len(timed)} timed results",
      "0 and 0", failed == 0 and wrong == 0))  # fmt: skip
  audit = _rows(out / "hlo_audit.jsonl")
  if audit:
    ok = sum(bool(r["match"]) and not r["all_reduce_ops"] for r in audit)
    found.append(_claim(
      "The compiled programs send exactly what the closed-form schedules say",
      f"{ok} of {len(audit)} (algorithm, p) match", "all", ok == len(audit)))  # fmt: skip
  # The fitted model's error is a measurement (see ``measurements``), not a claim: its
  # worst error at the few sizes ≥ 1 MiB moved between 16 % and 51 % over healthy runs
  # of the same settings, across a 25 % threshold, with the timing spread of 7 calls.
  ratios = []
  rows = _rows(out / "bench_auto.jsonl")
  for n in sorted({r["bytes"] for r in rows}):
    at = {r["algorithm"]: r["time_us"] for r in rows if r["bytes"] == n}
    custom = [t for a, t in at.items() if a in ALGORITHMS and ALGORITHMS[a].auto]
    if "auto" in at and custom:
      ratios.append(at["auto"] / min(custom))
  if ratios:
    med = statistics.median(ratios)
    found.append(_claim(
      "`auto` is as fast as the fastest hand-written algorithm",
      f"auto / fastest: median {med:.2f}×, worst {max(ratios):.2f}× over {len(ratios)} sizes",
      "median ≤ 1.10×", med <= 1.10, judged=not smoke))  # fmt: skip
  fusion = [r for r in _rows(out / "fusion.jsonl") if r.get("speedup_vs_per_leaf")]
  if fusion:
    best = max(fusion, key=lambda r: r["speedup_vs_per_leaf"])
    found.append(_claim(
      "Bucketing a many-leaf gradient beats reducing it leaf by leaf",
      f"{best['speedup_vs_per_leaf']:.1f}× ({best['model']}, "
      f"{'one bucket' if best['bucket'] == 'one' else str(best['bucket']) + ' buckets'})",
      "≥ 2×", best["speedup_vs_per_leaf"] >= 2))  # fmt: skip
  replayed = replay_winners(_rows(out / "scaling_topology.jsonl"))
  if replayed:
    changed = [w for w in replayed if w["best (replay)"] != w["best (flat model)"]]
    worst = max(replayed, key=lambda w: w["HD far-first: replay / flat"] or 0)
    found.append(_claim(
      "On real network shapes the winner changes: the flat model's choice is not the replay's",
      f"{len(changed)} of {len(replayed)} (network, size) cells; far-first halving-doubling"
      f" {worst['HD far-first: replay / flat'] or 0:.1f}× its flat time ({worst['network']},"
      f" {worst['size / participant']}, p = {worst['p']})",
      "≥ 1 cell", len(changed) >= 1))  # fmt: skip
  # Sync vs async on one clock (simulated time: compute + communication, so the same
  # on any machine), both sides of the README's headline: the 100 M-parameter run,
  # where the parameter server's link carries the model, and the real size.
  ttt, row = _time_to_target(out / "train" / "table_c_100m" / "table_c.jsonl")
  if {"sync_b1", "async"} <= set(ttt):
    found.append(_claim(
      f"Sync vs async on one clock, a {(row.get('model_params') or 0) / 1e6:.0f} M-parameter model"
      f" priced on {row.get('network')}: sync with one backup worker reaches the target"
      " before the asynchronous parameter server",
      f"simulated time to {row.get('target', 0.95):.0%}: sync_b1 {ttt['sync_b1']:.3g} s,"
      f" async {ttt['async']:.3g} s (median over seeds; one 4×-slow worker)",
      "sync_b1 < async", ttt["sync_b1"] < ttt["async"]))  # fmt: skip
  ttt, row = _time_to_target(out / "train" / "table_c" / "table_c.jsonl")
  if {"sync_b1", "async"} <= set(ttt):
    found.append(_claim(
      f"At the model's real size on {row.get('network')} communication is negligible: the"
      " asynchronous parameter server reaches the target before sync with one backup worker",
      f"simulated time to {row.get('target', 0.95):.0%}: async {ttt['async']:.3g} s,"
      f" sync_b1 {ttt['sync_b1']:.3g} s (median over seeds; one 4×-slow worker)",
      "async < sync_b1", ttt["async"] < ttt["sync_b1"]))  # fmt: skip
  accs = [r["final_test_acc"] for p in sorted((out / "train").glob("sync/*.jsonl"))
          for r in _rows(p) if r.get("final_test_acc") is not None]  # fmt: skip
  if accs:
    acc = statistics.mean(accs)
    found.append(_claim(
      "Data-parallel training over the hand-written ring learns",
      f"test accuracy {acc:.1%} ({len(accs)} run(s))", "≥ 90 %", acc >= 0.9))  # fmt: skip
  return found


def _quantiles(xs: list[float]) -> str:
  """``"median 15 % (range 1–46 %)"`` of fractions."""
  lo, med, hi = (round(100 * x) for x in (min(xs), statistics.median(xs), max(xs)))
  return f"median {med} % (range {lo}–{hi} %)"


def measurements(out: Path) -> list[dict]:
  """What the report measures but does not judge: a number with its range, where the
  run-to-run spread is too wide for a threshold to be a claim (a claim that flips
  between healthy runs is not one). Today: the fitted α-β-γ model's relative error on
  the bandwidth-bound sizes (≥ 1 MiB), each algorithm's own fit, next to the spread of
  the timed calls it is compared with."""
  rows = _rows(out / "bench.jsonl")
  fitted = _fit(out)
  if not rows or fitted is None:
    return []
  _, table = fit_report(rows, fitted, 1 << 20)
  if not table:
    return []
  errs = [abs(t["fit_err"]) for t in table]
  ring = [abs(t["fit_err"]) for t in table if t["algorithm"] == "ring"]
  timed = {(r["algorithm"], r["bytes"]): r for r in rows}
  spread = [
    (r["time_us_max"] - r["time_us_min"]) / r["time_us"]
    for t in table
    if (r := timed.get((t["algorithm"], t["bytes"]))) and r.get("time_us_min") is not None
  ]
  top = max(t["bytes"] for t in table)
  under = sum(t["fit_err"] < 0 for t in table if t["bytes"] == top)
  at_top = sum(t["bytes"] == top for t in table)
  value = f"|error| {_quantiles(errs)} over {len(table)} (algorithm, size)"
  if ring:
    value += f"; the ring's {_quantiles(ring)} over {len(ring)} sizes"
  context = (
    f"the timed calls' min–max spans {_quantiles(spread)} of their median; " if spread else ""
  ) + (
    f"at {format_bytes(top)} the model is below the measured time for {under} of"
    f" {at_top} algorithms"
  )
  return [{
    "measurement": "The fitted α-β-γ model's error on the bandwidth-bound sizes (≥ 1 MiB),"
    " each algorithm's own fit",
    "measured": value,
    "context": context.strip(),
  }]  # fmt: skip


def _sentence(parts: list[str], joint: str) -> list[str]:
  """``parts`` as one sentence (capitalised, a full stop), or none if there are none.

  Example:
    >>> _sentence(["the ring won", "psum came second"], "; ")
    ['The ring won; psum came second.']
  """
  if not parts:
    return []
  sentence = joint.join(parts)
  return [sentence[0].upper() + sentence[1:] + "."]


def findings(out: Path) -> list[str]:
  """What this run found, in (at most) three sentences computed from its rows: the
  one-process measurements, what the latency term decides, and the network (emulated
  cluster, replay at scale). Sections that did not run are left out."""
  said: list[str] = []
  verify = _rows(out / "verify.jsonl")
  bench = [r for r in _rows(out / "bench.jsonl") if r.get("n_devices", 0) > 1]
  if bench:
    p, top = bench[0]["n_devices"], max(r["bytes"] for r in bench)
    at = {r["algorithm"]: r for r in bench if r["bytes"] == top and r.get("count", 0) % p == 0}
    ref = next((r for a, r in at.items() if plot.is_reference(a)), None)
    mine = [r for a, r in at.items() if not plot.is_reference(a)]
    backend = bench[0].get("backend") or ""
    head = f"On {p} {backend} devices in one process".replace("  ", " ")
    if verify:
      failed = sum(not r["passed"] for r in verify)
      head += (
        f", every algorithm matched the NumPy oracle in all {len(verify):,} verify cases"
        if not failed
        else f", {failed:,} of {len(verify):,} verify cases failed"
      )
    if ref and mine:
      best = max(mine, key=lambda r: r["busbw_GBps"])
      ratio = best["busbw_GBps"] / ref["busbw_GBps"]
      head += (
        f"; at {format_bytes(top)} per participant the fastest hand-written algorithm,"
        f" {best['algorithm']}, reached {ratio:.2f}× the bus bandwidth of XLA's own"
        f" {ref['algorithm']} ({best['busbw_GBps']:.2g} against {ref['busbw_GBps']:.2g} GB/s)"
      )
    said.append(head + ".")
  fitted = _fit(out)
  fusion = [r for r in _rows(out / "fusion.jsonl") if r.get("speedup_vs_per_leaf")]
  parts = []
  if fitted is not None and bench:
    ring = fitted.get("ring")
    n_star = cost_model.balance_bytes("ring", bench[0]["n_devices"], ring)
    if math.isfinite(n_star):
      parts.append(
        f"below about {format_bytes(n_star)} per participant the ring is latency-bound"
        f" (its fitted α is {ring.alpha * 1e6:.0f} µs a step)"
      )
  if fusion:
    best = max(fusion, key=lambda r: r["speedup_vs_per_leaf"])
    parts.append(
      f"so reducing the {best['model']}'s {best['n_leaves']}-leaf gradient in"
      f" {'one bucket' if best['bucket'] == 'one' else best['bucket'] + ' buckets'} instead of"
      f" leaf by leaf made it {best['speedup_vs_per_leaf']:.1f}× faster"
    )
  said += _sentence(parts, ", ")
  net = [r for r in _rows(out / "network" / "bench.jsonl") if r.get("wrong") == 0]
  replayed = replay_winners(_rows(out / "scaling_topology.jsonl"))
  parts = []
  where = plot.network_of(net) if net else None
  ring = [r for r in net if r["algorithm"] == "ring"]
  if where and ring:
    top = max(ring, key=lambda r: r["bytes"])
    p, n = top["n_devices"], top["bytes"]
    line = n * 2 * (p - 1) / p / (top["time_us"] * 1e-6) / where["link_Bps"]
    fastest = min((r for r in net if r["bytes"] == n), key=lambda r: r["time_us"])
    parts.append(
      f"on the emulated network ({plot.network_title(where)}) the ring moved {line:.2f} of"
      f" the line rate at {format_bytes(n)}, and"
      + (
        f" XLA's {fastest['algorithm']} (gloo's own all-reduce) was fastest there"
        if plot.is_reference(fastest["algorithm"])
        else f" {fastest['algorithm']} was fastest there"
      )
    )
  if replayed:
    changed = sum(w["best (replay)"] != w["best (flat model)"] for w in replayed)
    parts.append(
      f"replayed on {len({w['network'] for w in replayed})} network shapes at up to"
      f" {max(w['p'] for w in replayed):,} participants, the fastest algorithm differs from"
      f" the flat α-β model's choice in {changed} of {len(replayed)} (network, size) cells"
    )
  said += _sentence(parts, "; ")
  return said


def write_markdown(out: Path, sections: list[Section], env: dict, smoke: bool) -> Path:
  """Writes ``REPORT.md`` (and ``REPORT.html`` when the ``markdown`` package is
  installed): the summary first, one section per experiment, the environment last.
  Each section's console output goes to ``logs/<section>.log``, linked from it."""
  md = [
    "# allreduce-jax report" + (" (smoke: tiny sizes)" if smoke else ""),
    "",
    f"Measured by `allreduce-jax report{' --smoke' if smoke else ''}` on {env.get('devices')}"
    f" {env.get('backend')} device(s), {env.get('date')}"
    + (f", at commit `{env['commit']}`" if env.get("commit") else "")
    + ". Every number below comes from the rows"
    " this run wrote next to this file; each section says how to reproduce it.",
    "",
    "## Summary",
    "",
  ]
  said = findings(out)
  if said:
    md += ["**What this run found.** " + " ".join(said), ""]
  found = claims(out, smoke)
  md += ["**Claims**, each judged against its threshold from this run's rows:", ""] if found else []
  md += [to_markdown(found, {"claim": "claim", "measured": "measured", "threshold": "threshold",
                             "result": "result"}) if found else "*no section has run yet*", ""]  # fmt: skip
  measured = measurements(out)
  if measured:
    md += [
      "**Measured, not judged** (the spread between runs is wider than any threshold"
      " worth claiming):",
      "",
      to_markdown(measured),
      "",
    ]
  if (out / "bench.png").exists():
    md += ["![all-reduce time vs size](bench.png)", ""]
  failed = [s.title for s in sections if s.status]
  if failed:
    md += [f"**{len(failed)} section(s) failed:** {', '.join(failed)}.", ""]
  logs = out / "logs"
  for s in sections:
    md += [f"## {s.title}", ""]
    if s.status is None:
      md += [s.intro, "", "*not run yet*", ""]
      continue
    if s.status:
      md += [f"**✗ failed** (exit status {s.status}); what it wrote is shown below.", ""]
    md += [s.intro, ""]
    try:
      md += RENDER[s.key](out) if s.key in RENDER else []
    except Exception as e:  # a partial or foreign file must not hide the other sections
      md += [f"*could not render this section's rows: {type(e).__name__}: {e}*", ""]
    for fig in s.figures:
      md += [f"![{Path(fig).stem}]({fig})", ""]
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{s.key}.log").write_text(s.text)
    commands = "\n".join(f"allreduce-jax {' '.join(c)}" for c in s.commands)
    md += _details(
      f"Reproduce ({s.seconds:.0f} s here)",
      f"```bash\n{commands}\n```\n\nConsole output: [logs/{s.key}.log](logs/{s.key}.log)",
    )
  md += [
    "## Environment",
    "",
    to_markdown([{"k": k, "v": v} for k, v in env.items()], {"k": "", "v": ""}),
    "",
  ]
  md += [
    "## Notebooks",
    "",
    "`notebooks/` re-runs each part interactively and explains it (`make lab`).",
    "",
  ]
  path = out / "REPORT.md"
  text = "\n".join(md)
  path.write_text(text)
  try:
    import markdown
  except ImportError:
    pass
  else:
    body = markdown.markdown(text, extensions=["tables", "fenced_code"])
    (out / "REPORT.html").write_text(
      f"<!doctype html><meta charset='utf-8'><title>allreduce-jax report</title>\n{body}\n"
    )
  return path


def redraw_figures(out: Path) -> list[Path]:
  """Draws every figure of a report folder again from the rows in it, with the
  functions the sections draw them with (``tools.plot``, ``training.figures``);
  measures nothing. A figure whose rows are missing is skipped. Returns the paths
  written."""
  written = []
  params = _fit(out)

  def save(fig, name: str, dpi: int = 120):
    if fig is not None:
      written.append(plot.save(fig, out / name, dpi=dpi))

  for name in ("bench", "bench_auto", "compression/bench", "network/bench"):
    rows = _rows(out / f"{name}.jsonl")
    if rows:
      save(plot.bench(rows, params), f"{name}.png")
  if rows := _rows(out / "hlo_audit.jsonl"):
    save(plot.audit(rows), "hlo_audit.png", dpi=110)
  if rows := _rows(out / "fusion.jsonl"):
    save(plot.fusion(rows), "fusion.png")
  for name in ("scaling_topology", "scaling"):
    if rows := _rows(out / f"{name}.jsonl"):
      save(plot.scaling(rows, crossovers(rows)), f"{name}.png", dpi=110)

  def train(fig, name: str):
    written.append(train_figures.save(fig, out / name))

  for folder in ("train/table_c", "train/table_c_100m", "compression/table_c"):
    if rows := [r for r in _rows(out / folder / "table_c.jsonl") if "arm" in r]:
      train(train_figures.table_c_figure(rows), f"{folder}/table_c_curves.png")
  if rows := _rows(out / "train" / "staleness" / "staleness.jsonl"):
    train(train_figures.staleness_figure(rows), "train/staleness/staleness_curves.png")
  if rows := _rows(out / "train" / "stragglers" / "stragglers.jsonl"):
    for name, fig in train_figures.straggler_figures(rows).items():
      train(fig, f"train/stragglers/{name}.png")
  if cells := _rows(out / "train" / "phase" / "phase_cells.jsonl"):
    train(train_figures.phase_figure(cells), "train/phase/phase.png")
  return written


def _recorded_environment(out: Path) -> dict:
  """The environment a report folder was measured in: ``sections.json``'s, or (folders
  written before it kept one there) the table under ``## Environment`` of its
  ``REPORT.md``; empty if neither has it."""
  state = load_json(out / "sections.json", {})
  if isinstance(state, dict) and isinstance(state.get(_ENVIRONMENT), dict):
    return state[_ENVIRONMENT]
  md = out / "REPORT.md"
  if not md.exists():
    return {}
  env = {}
  table = md.read_text().split("## Environment", 1)[-1].split("\n## ", 1)[0]
  for line in table.splitlines()[4:]:  # after the heading's blank line and the header
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 2 and cells[0]:
      env[cells[0]] = cells[1]
  return env


def redraw(out: Path, smoke: bool = False) -> Path:
  """Draws the figures and writes ``REPORT.md`` again from a report folder's rows, its
  ``sections.json`` (each section's commands, console output and time) and the
  environment it recorded: the report of those measurements with today's rendering,
  nothing re-run. Returns the markdown's path."""
  state = load_json(out / "sections.json", None)
  if not isinstance(state, dict):
    raise SystemExit(
      f"--redraw: {out / 'sections.json'} not found or unreadable; run the report first."
    )
  env = _recorded_environment(out)
  devices = int(env.get("devices") or 8)
  sections = plan(out, smoke, devices)
  for s in sections:
    old = state.get(s.key)
    if old:  # the recorded commands: the ones that wrote these rows
      s.commands, s.text, s.figures = old["commands"], old["text"], old["figures"]
      s.seconds, s.status = old["seconds"], old["status"]
  fitted = _fit(out)
  # The trace-time choices (the double tree's chunks) as the run made them: with its fit.
  with cost_model.use_params(fitted) if fitted is not None else contextlib.nullcontext():
    redraw_figures(out)
    return write_markdown(out, sections, env, smoke)


#: The key of ``sections.json`` that keeps the environment the report ran in.
_ENVIRONMENT = "environment"


def run_report(
  out: Path, smoke: bool = False, devices: int | None = None, only=None, fresh=False
) -> int:
  if fresh and out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True, exist_ok=True)
  try:
    devices = use_cpu_devices(devices)
  except ValueError as e:
    raise SystemExit(str(e)) from None
  env = environment()
  sections = plan(out, smoke, devices)
  if only:
    unknown = set(only) - {s.key for s in sections}
    if unknown:
      raise SystemExit(
        f"--only: unknown {sorted(unknown)}; expected some of {[s.key for s in sections]}"
      )
  os.environ["ALLREDUCE_JAX_COST_PARAMS"] = str(out / "cost_params.json")
  state_path = out / "sections.json"

  state = load_json(state_path, {})  # a truncated file: a warning, and start over
  state = state if isinstance(state, dict) else {}
  state[_ENVIRONMENT] = env  # what --redraw writes under "Environment"
  for s in sections:  # keep what earlier runs of the same commands printed
    old = state.get(s.key)
    if old and old.get("commands") == s.commands:
      s.text, s.figures, s.seconds, s.status = (
        old["text"],
        old["figures"],
        old["seconds"],
        old["status"],
      )
  failures = 0

  # The sections done so far, their rate and an ETA, on stderr (only on a terminal).
  bar = tqdm(sections, desc="report", unit="section", file=sys.stderr, disable=None)
  for k, s in enumerate(bar, 1):
    if only and s.key not in only:
      failures += bool(s.status)
      continue
    print(f"\n=== [{k}/{len(sections)}] {s.title}", flush=True)
    why = _network_skip() if s.key == "network" else None
    if s.key == "network":
      (out / "network" / "skipped.txt").unlink(missing_ok=True)
    if why:
      print(f"skipped: {why}")
      (out / "network").mkdir(exist_ok=True)
      (out / "network" / "skipped.txt").write_text(why + "\n")
      s.status, s.text, s.seconds = 0, f"skipped: {why}\n", 0.0
      state[s.key] = {"commands": s.commands, "text": s.text, "figures": [],
                      "seconds": 0.0, "status": 0}  # fmt: skip
      save_json(state_path, state)
      write_markdown(out, sections, env, smoke)
      continue
    before = set(out.rglob("*.png"))
    tee = _Tee(sys.stdout)
    t0 = time.perf_counter()
    s.status = 0
    with contextlib.redirect_stdout(tee):
      for argv in s.commands:
        print(f"$ {' '.join(argv)}")
        try:
          rc = _run_command(argv)
        except SystemExit as e:  # a subcommand's argument error
          if e.code is not None and not isinstance(e.code, int):
            print(f"error: {e.code}")
          rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # one failed section must not stop the others
          print(f"error: {type(e).__name__}: {e}")
          rc = 1
        s.status = s.status or rc
    s.seconds = time.perf_counter() - t0
    s.text = tee.buffer.getvalue()
    s.figures = sorted(p.relative_to(out).as_posix() for p in set(out.rglob("*.png")) - before)
    if not s.figures:  # resumed sweeps redraw in place: link the section's own figures
      stems = {Path(a).stem for argv in s.commands for a in argv if a.startswith(str(out))}
      s.figures = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")
                         if p.stem in stems or p.parent.name in stems)  # fmt: skip
    failures += s.status != 0
    state[s.key] = {"commands": s.commands, "text": s.text, "figures": s.figures,
                    "seconds": s.seconds, "status": s.status}  # fmt: skip
    save_json(state_path, state)  # atomic: an interrupted write keeps the previous state
    write_markdown(out, sections, env, smoke)
  path = write_markdown(out, sections, env, smoke)
  print(f"\n# wrote {path} ({failures} section(s) failed)")
  return 1 if failures else 0


def configure(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--out", default=None, help="folder (default results/report, or results/report.smoke)"
  )

  add_devices(parser)
  parser.add_argument(
    "--smoke", action="store_true", help="tiny sizes: the whole report in minutes"
  )
  parser.add_argument(
    "--only",
    type=csv_list,
    default=None,
    help=f"comma-separated sections, some of {','.join(RENDER)} (default: all)",
  )
  parser.add_argument(
    "--fresh", action="store_true", help="delete the folder first instead of resuming"
  )
  parser.add_argument(
    "--redraw",
    action="store_true",
    help="measure nothing: draw the figures and write REPORT.md again from the rows"
    " already in --out",
  )


def run(args: argparse.Namespace) -> int:
  out = Path(args.out or ("results/report.smoke" if args.smoke else "results/report"))
  output_dir(out, "--out")  # a regular file or an unwritable path: one line, before any work
  if args.redraw:
    if args.fresh or args.only:
      raise SystemExit("--redraw measures nothing: it takes neither --fresh nor --only.")
    print(f"# wrote {redraw(out, smoke=args.smoke)} (figures redrawn from the rows)")
    return 0
  return run_report(out, smoke=args.smoke, devices=args.devices, only=args.only, fresh=args.fresh)
