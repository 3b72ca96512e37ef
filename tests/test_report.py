"""``allreduce-jax report``: the rendering (from a small fixture of rows, no experiment
run) and one end-to-end ``--smoke`` run."""

import json
import re

import pytest

from allreduce_jax import cli, cost_model, names, netns
from allreduce_jax.tools import report


def _write(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _fixture(out):
  """A few rows of every kind the report reads, as the subcommands write them."""
  algs = ["ring", "recursive_doubling", "psum"]
  _write(out / "verify.jsonl", [
    {"algorithm": a, "op": op, "dtype": dt, "p": 8, "input_kind": kind, "shape": [13],
     "max_abs_err": 0.0, "bit_exact": True, "replicas_identical": True, "tolerance": 0.0,
     "passed": True}
    for a in algs for op in ("sum", "max") for dt in ("float32", "int32")
    for kind in ("verifiable", "random")
  ])  # fmt: skip
  _write(out / "hlo_audit.jsonl", [
    {"algorithm": a, "p": p, "bytes": 4096, "permutes": 2 * (p - 1), "permutes_model": 2 * (p - 1),
     "max_sent_bytes": 4096, "max_sent_bytes_model": 4096.0, "sent_over_n": 2 * (p - 1) / p,
     "all_reduce_ops": 0, "match": True, "compile_s": 0.1, "jax_version": "x", "p_note": None}
    for a in ("ring", "naive") for p in (2, 4)
  ])  # fmt: skip
  params = cost_model.Params(100e-6, 1e-9, 0.5e-9)
  bench = []
  for n in (1024, 65536, 1 << 20):
    for a in algs:
      t = cost_model.predict_seconds(a, 8, n, params) * (0.9 if a == "psum" else 1.0)
      bench.append({
        "algorithm": a, "n_devices": 8, "bytes": n, "count": n // 4, "dtype": "float32",
        "op": "sum", "time_us": t * 1e6 + 0.123456789, "time_us_min": t * 1e6 * 0.9,
        "time_us_max": t * 1e6 * 1.1, "algbw_gbps": n / t / 1e9,
        "busbw_gbps": n / t / 1e9 * 1.75, "wrong": 0, "predicted_us": None, "chosen": None,
      })  # fmt: skip
  _write(out / "bench.jsonl", bench)
  fit_rows = [(r["algorithm"], 8, r["bytes"], r["time_us"] * 1e-6) for r in bench]
  fitted = cost_model.fit_all(fit_rows)
  fitted.meta["max_abs_err_ge_1MiB"] = {"ring": 0.1}
  cost_model.save_params(fitted, out / "cost_params.json")
  auto = [dict(r, algorithm="auto", chosen="ring") for r in bench if r["algorithm"] == "ring"]
  _write(out / "bench_auto.jsonl", auto + bench)
  _write(out / "fusion.jsonl", [
    {"model": "transformer", "algorithm": "ring", "bucket": b, "bucket_bytes": bb, "n_leaves": 26,
     "n_buckets": k, "bytes": 1 << 20, "n_devices": 8, "time_us": t, "wrong": 0,
     "speedup_vs_per_leaf": 3000.0 / t, "backend": "cpu"}
    for b, bb, k, t in (("per-leaf", 0, 26, 3000.0), ("one", None, 1, 1000.0))
  ])  # fmt: skip
  _write(out / "scaling.jsonl", [
    {"scenario": "gpu-cluster", "algorithm": a, "p": p, "bytes": 1 << 20,
     "predicted_us": float(p if a == "ring" else 10), "best": "ring" if p < 16 else "tree",
     "ring_over_best": 1.0 if p < 16 else p / 10}
    for a in ("ring", "tree") for p in (8, 16, 32)
  ])  # fmt: skip
  _write(out / "train" / "sync" / "sync.jsonl", [{"final_test_acc": 0.97, "seed": 0}])
  (out / "train" / "staleness").mkdir(parents=True)
  (out / "train" / "staleness" / "table_a.md").write_text(
    "# Table A\n\n| method | acc |\n|---|---|\n| sync | 0.97 |\n"
  )
  sections = report.plan(out, smoke=True, devices=8)
  for s in sections:
    s.status, s.text, s.seconds = 0, f"$ {s.key}\n| a | b |\n|---|---|\n", 1.0
  failed = next(s for s in sections if s.key == "fusion")
  failed.status = 1
  return sections


def test_report_renders_from_rows(tmp_path):
  out = tmp_path / "report"
  sections = _fixture(out)
  env = {"date": "today", "devices": 8, "backend": "cpu", "maybe": None}
  text = report.write_markdown(out, sections, env, smoke=True).read_text()
  headings = re.findall(r"^## (.+)$", text, flags=re.M)
  assert headings[0] == "Summary"
  assert [h for h in headings if h in {s.title for s in sections}] == [s.title for s in sections]
  summary = text.split("## Summary")[1].split("\n## ")[0]
  assert "| claim | measured | threshold | result |" in summary
  assert 3 <= summary.count("✓ pass") + summary.count("✗ fail") <= 6
  assert "None" not in text and "nan" not in text.split()  # (NaN, the input kind, is text)
  assert not re.search(r"\d\.\d{7,}", text), "unrounded numbers"
  # No markdown table inside a code fence.
  in_fence = False
  for line in text.splitlines():
    if line.startswith("```"):
      in_fence = not in_fence
    assert not (in_fence and line.startswith("|")), line
  # The failed section is marked, the others still render their tables.
  fusion = text.split("## Tensor fusion")[1].split("\n## ")[0]
  assert "failed" in fusion and "| gradient pytree |" in fusion
  assert "| algorithm | float32 | int32 |" in text  # verify's algorithm × dtype pivot
  assert "bit-exact on 12 of 12 verifiable cases" in text  # input kinds survive the row store
  assert "fitted model (µs)" in text and "model(us)" not in text
  assert "γ (ns / B reduced)" in text and "| — |" in text  # per-algorithm γ: not identifiable
  assert "#### Table A" in text
  assert (out / "logs" / "bench.log").read_text().startswith("$ bench")


def test_sync_vs_async_claims_read_both_table_c_runs_and_can_fail(tmp_path):
  def table_c(folder, sync_b1, async_, params):
    _write(tmp_path / "train" / folder / "table_c.jsonl", [
      {"arm": arm, "seed": seed, "time_to_target": t, "target": 0.95, "network": "100gbe",
       "model_params": params}
      for arm, ts in (("sync_b1", sync_b1), ("async", async_)) for seed, t in enumerate(ts)
    ])  # fmt: skip

  def results():
    return {
      ("100 M" in c["claim"], c["measured"]): c["result"]
      for c in report.claims(tmp_path)
      if "asynchronous parameter server" in c["claim"]
    }

  table_c("table_c_100m", [3.0, 3.1, 2.9], [5.2, None, 5.0], 100_000_000)  # None: never reached
  table_c("table_c", [1.3, 1.4, 1.3], [0.8, 0.9, 0.85], None)
  assert sorted(results().items()) == [
    ((False, "simulated time to 95%: async 0.85 s, sync_b1 1.3 s (median over seeds;"
              " one 4×-slow worker)"), "✓ pass"),
    ((True, "simulated time to 95%: sync_b1 3 s, async 5.2 s (median over seeds;"
             " one 4×-slow worker)"), "✓ pass"),
  ]  # fmt: skip
  table_c("table_c_100m", [3.0], [2.0], 100_000_000)
  assert [r for (big, _), r in results().items() if big] == ["✗ fail"]


def test_report_renders_the_compression_rows(tmp_path):
  """The compression section: each wire format's error and bytes next to the exact
  program's, and Table C's compressed arms next to sync (paired by seed)."""
  out = tmp_path / "report"
  bench = [
    {"algorithm": a, "n_devices": 8, "bytes": n, "wire": w, "time_us": t, "rel_error": e,
     "wire_bytes_per_element": b}
    for n in (65536, 1 << 20)
    for a, w, t, e, b in (("ring", None, 100.0, 0.0, 7.0), ("ring", "int8", 250.0, 1.47e-2, 1.778),
                          ("ring", "bf16", 150.0, 3.5e-3, 3.5), ("psum", None, 90.0, 0.0, None))
  ]  # fmt: skip
  _write(out / "compression" / "bench.jsonl", bench)
  common = {"workload": "digits_mlp", "metric": "accuracy", "diverged": False, "final_loss": 0.01}
  train = [
    {**common, "arm": "sync", "seed": s, "final_metric": 0.97 + 0.01 * s, "bytes_per_sample": 4000.0}
    for s in (0, 1)
  ] + [
    {**common, "arm": "powersgd_r4", "seed": s, "final_metric": 0.965 + 0.01 * s,
     "bytes_per_sample": 400.0, "compression": "powersgd", "rank": 4, "error_feedback": True}
    for s in (0, 1)
  ]  # fmt: skip
  _write(out / "compression" / "table_c" / "table_c.jsonl", train)
  text = "\n".join(report._render_compression(out))
  assert "at 1 MiB per participant" in text
  lines = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ring")}
  assert set(lines) == {"none (exact)", "int8", "bf16"}  # the largest size only
  assert "0.254" in lines["int8"] and "2.5" in lines["int8"]  # 1.778 / 7 B; 250 / 100 µs
  assert "0.5" in lines["bf16"] and "0.0035" in lines["bf16"]
  psgd = next(line for line in text.splitlines() if "| powersgd_r4 |" in line)
  assert "PowerSGD r = 4" in psgd and "-0.50 [-0.50, -0.50]" in psgd and "10.0×" in psgd
  assert not re.search(r"\d\.\d{7,}", text), "unrounded numbers"
  assert report._render_compression(tmp_path / "empty") == []


def test_plan_is_the_one_definition_of_sizes():
  bench = report.settings("bench", smoke=True)
  argv = next(s for s in report.plan(report.Path("r"), True, 8) if s.key == "bench").commands[0]
  assert argv[argv.index("--max-bytes") + 1] == bench["max_bytes"]
  assert argv[argv.index("--iters") + 1] == str(bench["iters"])
  assert argv[argv.index("--algorithms") + 1].split(",") == list(names(priced=True))
  with pytest.raises(KeyError):
    report.settings("nope")


@pytest.mark.slow
def test_report_smoke_end_to_end(tmp_path, monkeypatch):
  monkeypatch.delenv("ALLREDUCE_JAX_COST_PARAMS", raising=False)
  out = tmp_path / "report"
  assert cli.main(["report", "--smoke", "--out", str(out)]) == 0
  text = (out / "REPORT.md").read_text()
  assert text.index("## Summary") < text.index("## Verification")
  assert "*not run yet*" not in text and "✗" not in text and "section(s) failed" not in text
  summary = {r["claim"]: r["result"] for r in report.claims(out, smoke=True)}
  # Judged at smoke size: simulated time (the same on any machine), both Table C runs.
  sync_async = [c for c in summary if "asynchronous parameter server" in c]
  assert len(sync_async) == 2 and all(summary[c] == "✓ pass" for c in sync_async)
  # auto vs the fastest at a few KiB and 3 timed calls: measured, shown, not judged.
  assert summary["`auto` is as fast as the fastest hand-written algorithm"] == report.NOT_JUDGED
  figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
  expected = {"hlo_audit.png", "bench.png", "bench_auto.png", "fusion.png", "scaling.png"}
  assert expected <= {f.split("/")[-1] for f in figures}
  for f in figures:
    assert (out / f).is_file(), f
  if netns.privilege_problem() is None:  # the network section ran on a 2-host cluster
    # ... and says what network its rows were measured on (their keys carry it).
    assert "at most 16 KiB queued in a host per TCP socket" in text
  # Resuming: a second run finds every sweep done and rewrites the same sections; verify,
  # which appends its cases, starts its file afresh (not counted twice).
  cases = re.search(r"\*\*([\d,]+) cases\*\* compared", text).group(1)
  assert cli.main(["report", "--smoke", "--out", str(out), "--only", "verify,scaling"]) == 0
  again = (out / "REPORT.md").read_text()
  assert "*not run yet*" not in again
  assert re.search(r"\*\*([\d,]+) cases\*\* compared", again).group(1) == cases


def test_the_summary_opens_with_what_the_run_found(tmp_path):
  """Three sentences computed from the rows (the numbers below recomputed from the same
  rows), before the claims; the fitted model's error is a measurement, not a claim."""
  out = tmp_path / "report"
  sections = _fixture(out)
  rows = report._rows(out / "bench.jsonl")
  top = max(r["bytes"] for r in rows)
  at = {r["algorithm"]: r for r in rows if r["bytes"] == top}
  ratio = at["ring"]["busbw_gbps"] / at["psum"]["busbw_gbps"]  # ring beats rd at 1 MiB
  said = report.findings(out)
  assert 2 <= len(said) <= 3 and all(s.endswith(".") for s in said)
  cases = len(report._rows(out / "verify.jsonl"))
  assert said[0].startswith("On 8 devices in one process, every algorithm matched")
  assert f"the NumPy oracle in all {cases} verify cases" in said[0]
  assert f"ring, reached {ratio:.2f}× the bus bandwidth of XLA's own psum" in said[0]
  assert "3.0× faster" in said[1]  # the fusion fixture: 3000 µs per leaf, 1000 µs in one
  text = report.write_markdown(out, sections, {"devices": 8}, smoke=True).read_text()
  summary = text.split("## Summary")[1].split("\n## ")[0]
  assert summary.index("What this run found") < summary.index("| claim |")
  assert not any("fitted α-β-γ model" in c["claim"] for c in report.claims(out))
  (measured,) = report.measurements(out)
  fitted = cost_model.load_params(out / "cost_params.json")
  errs = sorted(
    abs(cost_model.predict_seconds(r["algorithm"], 8, r["bytes"], fitted.get(r["algorithm"]))
        / (r["time_us"] * 1e-6) - 1)
    for r in rows if r["bytes"] >= 1 << 20
  )  # fmt: skip
  median = errs[len(errs) // 2]
  assert f"median {round(100 * median)} %" in measured["measured"]
  assert f"over {len(errs)} (algorithm, size)" in measured["measured"]
  assert "Measured, not judged" in summary


def test_findings_name_the_network_the_rows_ran_on(tmp_path):
  net = {"hosts": 4, "link_Bps": 25e6, "mtu": 1500, "network": "switch"}
  rows = [
    {"algorithm": a, "n_devices": 4, "bytes": 1 << 24, "time_us": t, "wrong": 0,
     "key": json.dumps({"network": net})}
    for a, t in (("ring", 1.2e6), ("psum", 1.1e6))
  ]  # fmt: skip
  _write(tmp_path / "network" / "bench.jsonl", rows)
  (said,) = report.findings(tmp_path)
  line = (1 << 24) * 2 * 3 / 4 / 1.2 / 25e6
  assert f"switch, 4 hosts, 200 Mbit/s links) the ring moved {line:.2f} of the line rate" in said
  assert "psum (gloo's own all-reduce) was fastest" in said


def test_redraw_measures_nothing_and_keeps_the_recorded_run(tmp_path, monkeypatch):
  out = tmp_path / "report"
  sections = _fixture(out)
  state = {s.key: {"commands": [["bench", "--out", "results/report/x.jsonl"]], "text": "$ x\n",
                   "figures": ["bench.png"], "seconds": 5.0, "status": 0} for s in sections}  # fmt: skip
  (out / "sections.json").write_text(json.dumps(state))
  env = {"date": "then", "devices": 8, "backend": "cpu", "commit": "abc1234"}
  report.write_markdown(out, sections, env, smoke=False)  # an older run's REPORT.md

  def measure(argv):
    raise AssertionError(f"--redraw ran {argv}")

  monkeypatch.setattr(report, "_run_command", measure)
  assert cli.main(["report", "--redraw", "--out", str(out)]) == 0
  text = (out / "REPORT.md").read_text()
  assert "| commit | abc1234 |" in text and "| date | then |" in text  # the recorded run
  assert "allreduce-jax bench --out results/report/x.jsonl" in text  # its own commands
  assert "*not run yet*" not in text
  for name in ("bench.png", "bench_auto.png", "hlo_audit.png", "fusion.png", "scaling.png"):
    assert (out / name).stat().st_size > 0, name
  with pytest.raises(SystemExit, match="--redraw measures nothing"):
    cli.main(["report", "--redraw", "--fresh", "--out", str(out)])


def test_the_network_section_says_what_its_model_column_and_bounds_are(tmp_path):
  """On the emulated network the console's model column is the in-process CPU fit (tens of
  times below the times), and some rows sit a little below their bound: both explained."""
  from pathlib import Path

  (network,) = [s for s in report.plan(tmp_path, True, 8) if s.key == "network"]
  assert "not a model of this network" in " ".join(network.intro.split())
  committed = Path(__file__).resolve().parents[1] / "docs" / "report"
  lines = "\n".join(report._render_network(committed)).splitlines()
  text = " ".join(" ".join(lines).split())
  table = [line.split("|")[1:-1] for line in lines if line.startswith("|")]
  header = [cell.strip() for cell in table[0]]
  rows = [dict(zip(header, (cell.strip() for cell in row))) for row in table[2:]]
  ratios = [float(r["measured / bound"]) for r in rows]
  for r, ratio in zip(rows, ratios):  # the ratio is the row's time over its half-duplex bound
    time, bound = float(r["time (s)"]), float(r["bound, half duplex (s)"])
    assert abs(ratio - time / bound) <= 0.015 * ratio, r  # three digits each
  if min(ratios) < 1:  # a row below its bound is explained, not left for the reader to puzzle
    assert "A row a little below its bound" in text and "no barrier between them" in text
