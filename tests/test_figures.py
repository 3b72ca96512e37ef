"""The figures: one look per algorithm (``allreduce_jax.palette``) in every figure the
tools draw, legends inside the saved image and off the data, compressed results split
by wire format, a network's rows drawn against that network's model."""

import pytest

from allreduce_jax import ALGORITHMS, palette


def test_every_registered_algorithm_has_its_own_look():
  looks = {a: palette.style(a) for a in ALGORITHMS}
  pairs = [(s["color"], s["marker"]) for s in looks.values()]
  assert len(set(pairs)) == len(pairs), looks
  # the colours alone tell them apart too (the palette has one per algorithm)
  assert len({s["color"] for s in looks.values()}) == len(looks)
  assert looks["psum"] == {"color": "black", "marker": "o", "linestyle": "-"}


def test_a_wire_keeps_the_colour_and_marker_and_changes_the_line():
  exact = palette.style("ring")
  assert palette.style("ring", "none") == exact
  lines = {palette.style("ring", w)["linestyle"] for w in (None, "bf16", "int8", "fp8")}
  assert len(lines) == 4
  for w in ("bf16", "int8", "fp8"):
    s = palette.style("ring", w)
    assert (s["color"], s["marker"]) == (exact["color"], exact["marker"])


def test_an_unknown_name_gets_a_stable_look_and_bad_input_one_line():
  assert palette.style("not_registered") == palette.style("not_registered")
  with pytest.raises(ValueError, match="wire='int4'"):
    palette.style("ring", "int4")
  with pytest.raises(ValueError, match="algorithm=None"):
    palette.style(None)


# ------------------------------------------------------------------ the tools' figures

import json  # noqa: E402

import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.image import imread  # noqa: E402

from allreduce_jax import cluster_rows, cost_model, devices, gloo_model, names  # noqa: E402
from allreduce_jax.tools import faults, plot  # noqa: E402
from allreduce_jax.tools.scaling import crossovers  # noqa: E402

PARAMS = cost_model.Params(100e-6, 1e-9, 0.5e-9)


def _bench_rows(algs, p=8, sizes=(1024, 65536, 1 << 20), wire=None, key=None):
  rows = []
  for n in sizes:
    for a in algs:
      inner = devices.inner_size(a, p)
      t = cost_model.predict_seconds(a, p, n, PARAMS, inner=inner) * 1e6 * (1.3 if wire else 1)
      rows.append({
        "algorithm": a, "n_devices": p, "bytes": n, "count": n // 4, "time_us": t,
        "time_us_min": 0.9 * t, "time_us_max": 1.1 * t, "busbw_GBps": n / t / 1e3,
        "wire": wire, "backend": "cpu", "key": json.dumps(key or {}), "choices": None,
      })  # fmt: skip
  return rows


def _algorithm_lines(fig):
  """``(axes, label, line)`` of every labelled line of an algorithm in ``fig``."""
  for ax in fig.axes:
    bars = [(c.get_label(), c.lines[0]) for c in ax.containers if hasattr(c, "has_xerr")]
    for label, line in [*((line.get_label(), line) for line in ax.get_lines()), *bars]:
      name = label.split(" ")[0]
      if name in ALGORITHMS and line is not None:
        yield ax, name, line


def _same_colour(a, b) -> bool:
  from matplotlib.colors import to_rgba

  return np.allclose(to_rgba(a), to_rgba(b))


def test_the_figures_draw_each_algorithm_in_its_palette_look():
  algs = list(names(priced=True))
  scaling = [
    {"scenario": sc, "algorithm": a, "p": p, "bytes": 1 << 20, "predicted_us": float(p * (k + 1)),
     "flat_us": float(p), "over_flat": float(k + 1), "best": "ring", "ring_over_best": 1.0}
    for sc in ("switch", "torus:3d") for k, a in enumerate(algs) for p in (8, 16, 32)
  ]  # fmt: skip
  audit = [{"algorithm": a, "p": p, "sent_over_n": 1.5, "compile_s": 0.1} for a in algs
           for p in (2, 4)]  # fmt: skip
  figures = {
    "bench": plot.bench(_bench_rows(algs), PARAMS),
    "busbw": plot.busbw(_bench_rows(algs)),
    "scaling": plot.scaling(scaling, crossovers(scaling)),
    "over_flat": plot.over_flat(scaling, 1 << 20),
    "audit": plot.audit(audit),
    "model": plot.model(8, PARAMS, algs[:4]),
  }
  for name, fig in figures.items():
    seen = set()
    for _, alg, line in _algorithm_lines(fig):
      look = palette.style(alg)
      assert _same_colour(line.get_color(), look["color"]), (name, alg)
      if line.get_marker() not in (None, "None", "none", ""):
        assert line.get_marker() == look["marker"], (name, alg)
      seen.add(alg)
    assert seen, name  # the figure drew labelled algorithm lines at all


def _legends(fig):
  return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def test_legends_sit_off_the_data_and_inside_the_saved_image(tmp_path):
  algs = [a for a in names(at_scale=True) if a in names(priced=True)]
  rows = [
    {"scenario": sc, "algorithm": a, "p": p, "bytes": n, "predicted_us": float(p * (k + 1) + n),
     "best": "ring", "ring_over_best": 1.0}
    for sc in ("fat_tree:8:7", "switch", "torus:3d") for n in (1 << 20, 1 << 28)
    for k, a in enumerate(algs) for p in (8, 64, 1024)
  ]  # fmt: skip
  figures = {
    "scaling": plot.scaling(rows, crossovers(rows)),
    "bench": plot.bench(_bench_rows(list(names(priced=True))), PARAMS),
  }
  for name, fig in figures.items():
    path = plot.save(fig, tmp_path / f"{name}.png", dpi=50)
    height, width = imread(path).shape[:2]
    renderer = FigureCanvasAgg(fig).get_renderer()
    tight = fig.get_tightbbox(renderer)  # what save kept, in inches
    data_axes = [ax for ax in fig.axes if ax.axison and ax.has_data()]
    labels = set()
    for legend in _legends(fig):
      box = legend.get_window_extent(renderer).transformed(fig.dpi_scale_trans.inverted())
      assert tight.x0 - 0.01 <= box.x0 and box.x1 <= tight.x1 + 0.01, name  # not clipped
      assert tight.y0 - 0.01 <= box.y0 and box.y1 <= tight.y1 + 0.01, name
      assert box.width * 50 <= width + 1 and box.height * 50 <= height + 1, name
      window = legend.get_window_extent(renderer)
      for ax in data_axes:  # off every panel that holds data
        assert not window.overlaps(ax.get_window_extent(renderer)), (name, ax.get_title())
      labels |= {t.get_text().split(" ")[0] for t in legend.get_texts()}
    drawn = {alg for _, alg, _ in _algorithm_lines(fig)}
    assert drawn <= labels, (name, drawn - labels)  # every algorithm in a legend (ring too)


def test_compressed_rows_are_split_by_wire_format():
  rows = [*_bench_rows(["ring", "two_shot", "psum"]), *_bench_rows(["ring", "two_shot"], wire="int8"),
          *_bench_rows(["ring", "two_shot"], wire="bf16")]  # fmt: skip
  fig = plot.bench(rows, PARAMS)
  titles = [ax.get_title() for ax in fig.axes if ax.axison]
  assert titles[0].startswith("exact") and {"bf16 on the wire", "int8 on the wire"} <= set(titles)
  for ax, alg, line in _algorithm_lines(fig):
    x = np.asarray(line.get_xdata(), float)
    assert np.all(np.diff(x) > 0), (ax.get_title(), alg)  # one wire per line: no zig-zag
  # a wire panel holds only its own rows (and the exact reference): 1.3x the exact times
  int8 = next(ax for ax in fig.axes if ax.get_title() == "int8 on the wire")
  ring = next(line for ax, a, line in _algorithm_lines(fig) if ax is int8 and a == "ring")
  exact = [r["time_us"] for r in rows if r["algorithm"] == "ring" and r["wire"] is None]
  np.testing.assert_allclose(np.asarray(ring.get_ydata(), float), np.asarray(exact) * 1.3)


def test_a_network_run_is_drawn_against_its_own_network():
  net = {"hosts": 4, "link_Bps": 25e6, "mtu": 1500, "network": "switch"}
  rows = _bench_rows(["ring", "halving_doubling", "psum"], p=4, sizes=(1 << 20, 1 << 22),
                     key={"network": net})  # fmt: skip
  fig = plot.bench(rows, PARAMS)  # the in-process fit is handed in and must not be drawn
  assert "switch, 4 hosts, 200 Mbit/s links" in fig._suptitle.get_text()
  link = gloo_model.link_params(25e6, 0.0, 1500)
  top = gloo_model.emulated("switch")
  dashed = [(alg, line) for _, alg, line in _algorithm_lines(fig)] + [
    (None, line) for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == "--"
  ]
  checked = 0
  for line in (line for _, line in dashed if line.get_linestyle() == "--"):
    colour = line.get_color()
    alg = next(
      a for a in ("ring", "halving_doubling") if _same_colour(colour, palette.style(a)["color"])
    )
    for n, t in zip(line.get_xdata(), line.get_ydata()):
      want = gloo_model.predict_seconds(alg, 4, n, link, top, "half") * 1e6
      assert t == pytest.approx(want, rel=1e-9)
      assert t > 10 * cost_model.predict_us(alg, 4, n, PARAMS)  # not the in-process fit
      checked += 1
  assert checked == 4


def test_rows_of_several_processes_on_an_unnamed_network_get_no_model():
  rows = [dict(r, process_count=4) for r in _bench_rows(["ring", "psum"], p=4)]
  fig = plot.bench(rows, PARAMS)
  assert "4 processes over gloo" in fig._suptitle.get_text()
  assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
  net = {"hosts": 4, "link_Bps": 25e6, "network": "switch"}  # named by the caller
  fig = plot.bench(rows, PARAMS, network=net)
  assert "switch, 4 hosts, 200 Mbit/s links" in fig._suptitle.get_text()
  assert [line for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == "--"]


# ------------------------------------------------------------------ what each mark means

import study_script  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_the_bench_legend_says_what_a_hollow_marker_is():
  rows = _bench_rows(["ring", "psum"], p=8, sizes=(1024, 1028, 65536))  # 257 floats: padded
  fig = plot.bench(rows, PARAMS)
  titles = [t.get_text() for ax in fig.axes if (lg := ax.get_legend()) for t in [lg.get_title()]]
  titles += [t.get_text() for lg in fig.legends for t in [lg.get_title()]]
  assert any("hollow: a size not a multiple of p" in t for t in titles), titles
  even = plot.bench(_bench_rows(["ring", "psum"], p=8, sizes=(1024, 65536)), PARAMS)
  legends = [ax.get_legend() for ax in even.axes if ax.get_legend()] + list(even.legends)
  assert legends and not any("hollow" in lg.get_title().get_text() for lg in legends)


def test_the_slow_link_figure_draws_the_blocks_runs_each_slowdown_its_own_mark(tmp_path):
  figures = study_script.load(ROOT / "experiments" / "faults" / "figures.py")
  fig = figures.figure(tmp_path / "slow_link.png")
  (ax,) = fig.axes
  series = [c for c in ax.containers if hasattr(c, "has_xerr")]
  looks = {(c.lines[0].get_marker(), c.lines[0].get_color()) for c in series}
  assert len(series) == 3 and len(looks) == 3  # 1/2, 1/10, 1/100: told apart
  # The points are the medians of the runs timed in blocks, as the answer's numbers are.
  n, rate = 2**20, 25e6
  rows = cluster_rows.bench_rows(ROOT / "experiments" / "faults" / "rows" / "slow_link_alone.jsonl")
  blocks = [r for r in rows if r["iters"] == 3
            and r["bytes"] == n and json.loads(r["key"])["network"]["hosts"] == 4
            and json.loads(r["key"])["network"]["network"] == "switch"]  # fmt: skip
  ring10 = sorted(r["time_us"] for r in blocks if r["algorithm"] == "ring"
                  and cluster_rows.slowdown(r, faults.row_links) == 10)  # fmt: skip
  want = ring10[len(ring10) // 2] * 1e-6 / (n * 10 / rate)
  ring_y = [t.get_text() for t in ax.get_yticklabels()].index("ring")
  drawn = [x for c in series if "1/10 " in c.get_label()
           for x, y in c.lines[0].get_xydata() if abs(y - ring_y) < 0.5]  # fmt: skip
  assert drawn == [pytest.approx(want)]


def test_the_mpi_peer_figure_tells_every_series_apart_in_bytes(tmp_path):
  from matplotlib.colors import to_rgb

  tables = study_script.load(ROOT / "experiments" / "mpi_peer" / "tables.py")
  fig = tables.figure(tmp_path / "mpi_peer.png")
  panels = [ax for ax in fig.axes if ax.get_lines()]
  for ax in panels:
    lines = {line.get_label(): line for line in ax.get_lines()}
    looks = [(to_rgb(line.get_color()), line.get_linestyle(), line.get_marker())
             for line in lines.values()]  # fmt: skip
    assert len(set(looks)) == len(looks), ax.get_title()
    solid = [to_rgb(line.get_color()) for name, line in lines.items() if "(" not in name]
    for i, a in enumerate(solid):  # the hand-written ones and psum: colours far apart
      for b in solid[i + 1 :]:
        assert np.linalg.norm(np.subtract(a, b)) > 0.3, ax.get_title()
    if "ring" in lines and "psum" in lines:  # psum lies on the ring: hollow and larger
      assert lines["psum"].get_markerfacecolor() == "none"
      assert lines["psum"].get_markersize() > lines["ring"].get_markersize()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels and all(t.endswith(("B", "KiB", "MiB")) for t in labels), labels
  assert len([lg for ax in fig.axes if (lg := ax.get_legend())]) == 1  # one legend for all
