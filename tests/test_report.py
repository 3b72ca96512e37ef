"""``allreduce-jax report --smoke``: every section runs and the report holds it all."""

import re

from allreduce_jax import cli
from allreduce_jax.tools import report


def test_report_smoke_has_every_section_and_figure(tmp_path, monkeypatch):
  monkeypatch.delenv("ALLREDUCE_JAX_COST_PARAMS", raising=False)
  out = tmp_path / "report"
  assert cli.main(["report", "--smoke", "--out", str(out)]) == 0
  text = (out / "REPORT.md").read_text()
  for section in report.plan(out, smoke=True, devices=8):
    assert f"## {section.title}" in text
  assert "*not run yet*" not in text and "exit status" not in text
  for heading in ("## Environment", "## Headlines"):
    assert heading in text
  figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
  expected = {"hlo_audit.png", "bench.png", "bench_auto.png", "fusion.png", "scaling.png"}
  assert expected <= {f.split("/")[-1] for f in figures}
  assert any(f.startswith("train/") for f in figures)
  for f in figures:
    assert (out / f).is_file(), f
  assert "wrong elements over all timed results: 0" in text
  # Resuming: a second run finds every sweep done and rewrites the same sections.
  assert cli.main(["report", "--smoke", "--out", str(out), "--only", "scaling"]) == 0
  again = (out / "REPORT.md").read_text()
  assert "## Scaling by model" in again and "*not run yet*" not in again
