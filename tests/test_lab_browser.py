"""The notebooks where their users meet them: JupyterLab as ``make lab`` starts it.

``lab/serve`` (what ``make lab`` runs) is started on a copy of ``notebooks/`` kept in a git
repository of its own, on 127.0.0.1 with a token and a free port. Checked here:

- a save of each unchanged notebook through jupytext's contents manager leaves its ``.py``
  byte for byte as it was, and the outputs go to ``notebooks/.ipynb/`` (ignored by git);
- every kernel the lab offers sees 8 CPU devices, the small one with ``ALLREDUCE_JAX_SMALL=1``;
- in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by selenium), each
  notebook opened by a double-click in the file browser, the small kernel chosen, Run All:
  no error output, an image under every cell that draws a figure, the closing cell's printed
  conclusion, and after a save and close ``git status`` clean. A notebook that raises is run
  first and must be reported. Afterwards nothing started here is left running.

The first figure of each notebook is saved to ``results/lab_browser/NN_name.png`` and the run
times to ``results/lab_browser/times.json``. Run alone: ``pytest tests/test_lab_browser.py``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
ARTIFACTS = ROOT / "results" / "lab_browser"
SMALL_KERNEL = "allreduce-jax small (8 CPU devices)"
RUN_TIMEOUT_S = 300  # one notebook in small mode: 10-110 s measured beside other work on 2 cores

pytestmark = pytest.mark.slow


def _copy_as_repository(dest: Path, extra: dict[str, str] | None = None) -> Path:
  """``notebooks/`` (its tracked files: the ``.py`` and ``jupytext.toml``) and ``.gitignore``
  copied to ``dest``, committed there; ``extra`` adds notebooks by name. Returns the copy's
  notebooks folder."""
  (dest / "notebooks").mkdir(parents=True)
  shutil.copy(ROOT / ".gitignore", dest / ".gitignore")
  for path in [*NOTEBOOKS, ROOT / "notebooks" / "jupytext.toml"]:
    shutil.copy(path, dest / "notebooks" / path.name)
  for name, text in (extra or {}).items():
    (dest / "notebooks" / name).write_text(text)
  git = ["git", "-C", str(dest), "-c", "user.name=t", "-c", "user.email=t@t"]
  subprocess.run([*git, "init", "-q"], check=True)
  subprocess.run([*git, "add", "-A"], check=True)
  subprocess.run([*git, "commit", "-q", "-m", "copy"], check=True)
  return dest / "notebooks"


def _git_status(repo: Path) -> str:
  return subprocess.run(
    ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True, check=True
  ).stdout


def test_a_save_of_each_unchanged_notebook_leaves_its_py_as_it_was(tmp_path):
  """What a save in Lab does, through the contents manager jupytext gives the server, with the
  metadata Lab adds (the kernel chosen, language_info, per-cell state)."""
  from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
  from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

  nbdir = _copy_as_repository(tmp_path)
  manager_class = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)
  cm = manager_class(root_dir=str(nbdir), allow_hidden=True)  # as lab/serve configures it

  async def save_each():
    for path in NOTEBOOKS:
      nb = (await cm.get(path.name, content=True, type="notebook"))["content"]
      nb.metadata["kernelspec"] = {"name": "allreduce-jax-small", "display_name": SMALL_KERNEL}
      nb.metadata["language_info"] = {"name": "python", "version": "3.11"}
      for cell in nb.cells:
        cell.metadata.update({"scrolled": True, "execution": {"iopub.status.idle": "now"}})
      await cm.save({"type": "notebook", "format": "json", "content": nb}, path.name)
      reopened = (await cm.get(path.name, content=True, type="notebook"))["content"]
      assert reopened.metadata["kernelspec"]["name"] == "allreduce-jax-small", path.name

  asyncio.run(save_each())
  changed = [p.name for p in NOTEBOOKS if (nbdir / p.name).read_bytes() != p.read_bytes()]
  assert not changed, f"a save rewrote {changed}: they are not what jupytext writes"
  assert sorted(p.name for p in (nbdir / ".ipynb").glob("*.ipynb")) == [
    p.stem + ".ipynb" for p in NOTEBOOKS
  ]
  assert _git_status(tmp_path) == "", "what a save writes must be ignored by git"


# --- the server, as make lab starts it --------------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Lab:
  """``lab/serve`` on ``nbdir`` with a private home; its URL read from what it prints."""

  def __init__(self, nbdir: Path, home: Path):
    self.home, port = home, _free_port()
    home.mkdir(parents=True, exist_ok=True)
    self.log = home / "lab.log"
    env = {
      **os.environ,
      "HOME": str(home),  # Jupyter's settings, workspaces and runtime files: this run's own
      "ALLREDUCE_JAX_RESULTS": str(home / "results"),
      "ALLREDUCE_JAX_LAB_DIR": str(nbdir),
    }
    for name in ("JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "MPLBACKEND"):
      env.pop(name, None)  # MPLBACKEND: the kernel's own inline backend, as in Jupyter
    with open(self.log, "w") as log:
      self.proc = subprocess.Popen(
        [ROOT / "lab" / "serve", "--no-browser", f"--port={port}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
      )  # fmt: skip
    try:  # the URL it prints, with the token it made up
      deadline = time.monotonic() + 180
      while not (
        m := re.search(r"http://127\.0\.0\.1:(\d+)/lab\?token=(\w+)", self.log.read_text())
      ):
        assert self.proc.poll() is None, f"lab/serve exited:\n{self.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "lab/serve printed no URL in 180 s"
        time.sleep(0.5)
    except BaseException:
      self.stop()
      raise
    assert m[1] == str(port), m[0]
    self.url, self.token, self.base = m[0], m[2], f"http://127.0.0.1:{port}"
    self._wait_until_it_answers()

  def _wait_until_it_answers(self, seconds: float = 120) -> None:
    """The URL is printed before the server listens for good (it is still writing its
    server-info file): ready is when its API answers, not when it has printed."""
    deadline = time.monotonic() + seconds
    while True:
      try:
        self.api("GET", "/api/status")
        return
      except (urllib.error.URLError, ConnectionError) as e:
        if self.proc.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise AssertionError(f"lab/serve's API never answered ({e}):\n"
                               f"{self.log.read_text()[-3000:]}") from None  # fmt: skip
        time.sleep(0.2)

  def api(self, method: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json"}
    req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
      return json.loads(r.read() or b"null")

  def stop(self):
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGINT)  # Ctrl-C
      time.sleep(0.5)
      self.proc.send_signal(signal.SIGINT)  # twice: no confirmation, kernels shut down
      try:
        self.proc.wait(60)
      except subprocess.TimeoutExpired:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def _processes_mentioning(text: str) -> list[str]:
  """Command lines of running processes that contain ``text`` (kernels name their connection
  file, Chromium its profile folder: both under this run's temporary folder)."""
  found = []
  for proc in Path("/proc").glob("[0-9]*"):
    try:
      cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      continue
    if text in cmd and int(proc.name) != os.getpid():
      found.append(f"{proc.name}: {cmd[:160]}")
  return found


def _wait_until_gone(text: str, seconds: float = 30) -> list[str]:
  deadline = time.monotonic() + seconds
  while (left := _processes_mentioning(text)) and time.monotonic() < deadline:
    time.sleep(0.5)
  return left


_PROBE = "import jax, os; print(len(jax.devices('cpu')), os.environ['ALLREDUCE_JAX_SMALL'])"


def _run_in_kernel(lab: Lab, kernel_id: str, code: str) -> str:
  from jupyter_client import BlockingKernelClient

  runtime = lab.home / ".local" / "share" / "jupyter" / "runtime"
  client = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel_id}.json"))
  client.load_connection_file()
  client.start_channels(hb=False)  # no heartbeat: a busy machine misses beats; the server watches
  try:
    client.wait_for_ready(timeout=120)
    out: list[str] = []
    reply = client.execute_interactive(
      code, timeout=120, output_hook=lambda m: out.append(m["content"].get("text", ""))
    )
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out).strip()
  finally:
    client.stop_channels()


def test_every_kernel_the_lab_offers_sees_8_cpu_devices(tmp_path):
  """A new notebook or console gets the lab's default kernel or the one the user picks: the two
  offered (and no other) each see 8 devices; the small one runs in small mode."""
  lab = Lab(_copy_as_repository(tmp_path / "repo"), tmp_path / "home")
  try:
    specs = lab.api("GET", "/api/kernelspecs")
    names = {k: v["spec"]["display_name"] for k, v in specs["kernelspecs"].items()}
    assert names == {
      "allreduce-jax": "allreduce-jax (8 CPU devices)",
      "allreduce-jax-small": SMALL_KERNEL,
    }
    assert specs["default"] == "allreduce-jax"
    seen = {}
    # None: what a console from the launcher gets; python3: hidden from the list, and a request
    # by name (a notebook whose metadata names it) gets the lab's default kernel.
    for name in [None, "allreduce-jax-small", "python3"]:
      kernel = lab.api("POST", "/api/kernels", {} if name is None else {"name": name})
      seen[kernel["name"]] = _run_in_kernel(lab, kernel["id"], _PROBE)
      lab.api("DELETE", f"/api/kernels/{kernel['id']}")
    assert seen == {"allreduce-jax": "8 0", "allreduce-jax-small": "8 1", "python3": "8 0"}
  finally:
    lab.stop()
  assert lab.proc.returncode is not None
  assert not _wait_until_gone(str(tmp_path)), "a kernel outlived the server"


# --- the browser ----------------------------------------------------------------------------


def _figure_makers() -> set[str]:
  """The functions of ``allreduce_jax.tools.plot`` that return a figure (by their annotation)."""
  import inspect

  from allreduce_jax.tools import plot

  return {
    name
    for name, fn in inspect.getmembers(plot, inspect.isfunction)
    if "Figure" in str(inspect.signature(fn).return_annotation)
  }


def figure_cells(source: str) -> list[int]:
  """Indices (among code cells) of the cells that draw a figure, read from the source: a cell
  that calls ``plt.show()``, or makes a pyplot figure it does not close (the inline backend
  shows it), or whose last statement shows a figure: ``fig``, ``display(fig)``, or a call of a
  ``plot.*`` function that returns one."""
  import jupytext

  makers, found = _figure_makers(), []
  code = [c.source for c in jupytext.reads(source, fmt="py:percent").cells if c.cell_type == "code"]
  for i, src in enumerate(code):
    lines = [line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
      body = ast.parse("\n".join(lines)).body
    except SyntaxError:
      continue
    shown = "plt.show()" in src or (
      any(f"plt.{f}(" in src for f in ("subplots", "figure", "subplot_mosaic"))
      and "plt.close(" not in src
    )
    value = body[-1].value if body and isinstance(body[-1], ast.Expr) else None
    if isinstance(value, ast.Name):
      shown |= value.id in ("fig", "figure")
    elif isinstance(value, ast.Call):
      func, args = value.func, value.args
      shown |= (
        isinstance(func, ast.Attribute)
        and func.attr in makers
        and (isinstance(func.value, ast.Name) and func.value.id == "plot")
      )
      shown |= (
        isinstance(func, ast.Name)
        and func.id == "display"
        and any(isinstance(a, ast.Name) and a.id in ("fig", "figure") for a in args)
      )
    if shown:
      found.append(i)
  return found


def test_figure_cells_reads_the_cells_that_draw():
  src = (
    "# %%\nimport matplotlib.pyplot as plt\n\n# %%\nplt.plot([1])\nplt.show()\n\n"
    "# %%\nfig = plot.model(8)\nfig\n\n# %%\nx = plot.model(8)\n\n# %%\nplot.busbw(rows)\n\n"
    "# %%\nplot.style('ring')\n\n# %%\nfig, ax = plt.subplots()\nax.plot([1])\n\n"
    "# %%\nfig, ax = plt.subplots()\nplt.close(fig)\n\n# %%\ndisplay(fig)\n"
  )
  assert figure_cells(src) == [1, 2, 4, 6, 8]


def _chromium() -> tuple[str, str] | None:
  browser = shutil.which("chromium") or shutil.which("chromium-browser")
  driver = shutil.which("chromedriver")
  return (browser, driver) if browser and driver else None


class Browser:
  def __init__(self, profile: Path):
    from selenium import webdriver

    browser, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1400", f"--user-data-dir={profile}"):  # fmt: skip
      options.add_argument(arg)
    self.service = webdriver.ChromeService(driver)
    self.driver = webdriver.Chrome(options=options, service=self.service)

  def quit(self):
    pid = self.service.process.pid if self.service.process else None
    self.driver.quit()
    return pid


def _wait(what, seconds: float, why: str):
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    try:
      if result := what():
        return result
    except AssertionError:
      raise
    except Exception:  # an element replaced while read: ask again
      pass
    time.sleep(0.25)
  raise TimeoutError(why)


def run_in_lab(driver, lab: Lab, nbdir: Path, path: Path, shots: Path | None) -> dict:
  """Open ``path`` as a user does, in small mode; Run All; save; close. Returns the problems
  found and the time from Run All to idle."""
  from selenium.webdriver.common.action_chains import ActionChains
  from selenium.webdriver.common.by import By
  from selenium.webdriver.common.keys import Keys
  from selenium.webdriver.support.ui import Select

  name, problems = path.name, []
  css = driver.find_elements
  # The file browser, a double-click on the notebook.
  item = _wait(
    lambda: [i for i in css(By.CSS_SELECTOR, ".jp-DirListing-item") if i.text.split("\n")[0] == name],
    60, f"{name} is not in the file browser",
  )[0]  # fmt: skip
  ActionChains(driver).double_click(item).perform()
  dialog = _wait(lambda: css(By.CSS_SELECTOR, ".jp-Dialog"), 60, "no kernel choice offered")[0]
  Select(dialog.find_element(By.TAG_NAME, "select")).select_by_visible_text(SMALL_KERNEL)
  dialog.find_element(By.CSS_SELECTOR, ".jp-Dialog-button.jp-mod-accept").click()
  panel = _wait(
    lambda: [p for p in css(By.CSS_SELECTOR, ".jp-NotebookPanel") if p.is_displayed()],
    60, f"{name} did not open as a notebook",
  )[0]  # fmt: skip
  session = _wait(
    lambda: [s for s in lab.api("GET", "/api/sessions") if s["path"] == name and s["kernel"]],
    120, f"no kernel started for {name}",
  )[0]  # fmt: skip
  kernel = session["kernel"]
  if kernel["name"] != "allreduce-jax-small":
    problems.append(f"kernel {kernel['name']}, not the small one")
  _wait(lambda: lab.api("GET", f"/api/kernels/{kernel['id']}")["execution_state"] == "idle",
        120, f"the kernel of {name} never became idle")  # fmt: skip

  # Run > Run All Cells, then wait for every prompt to settle and the kernel to be idle.
  def menu(top: str, label: str):
    next(m for m in css(By.CSS_SELECTOR, ".lm-MenuBar-item") if m.text == top).click()
    entry = _wait(
      lambda: [m for m in css(By.CSS_SELECTOR, ".lm-Menu-item") if m.is_displayed()
               and m.find_element(By.CSS_SELECTOR, ".lm-Menu-itemLabel").text == label],
      10, f"no menu entry {top} > {label}",
    )  # fmt: skip
    entry[0].click()

  def prompts() -> list[str]:  # "[3]:" run, "[*]:" running or queued, "[ ]:" not run
    return [
      e.text for e in panel.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .jp-InputArea-prompt")
    ]

  start = time.monotonic()
  menu("Run", "Run All Cells")
  _wait(lambda: any("*" in p for p in prompts()), 30, "Run All started nothing")

  def settled():
    state = lab.api("GET", f"/api/kernels/{kernel['id']}")["execution_state"]
    if state == "dead":
      raise AssertionError(f"the kernel of {name} died (out of memory?)")
    return state == "idle" and not any("*" in p for p in prompts())

  _wait(lambda: settled() and (time.sleep(1) or settled()), RUN_TIMEOUT_S,
        f"{name} still running after {RUN_TIMEOUT_S} s")  # fmt: skip
  seconds = time.monotonic() - start
  ran = prompts()
  if unrun := [i for i, p in enumerate(ran) if not re.search(r"\d", p)]:
    problems.append(
      f"{len(unrun)} of {len(ran)} code cells did not run (first: code cell {unrun[0]})"
    )

  # What the reader sees: images rendered in the page.
  images = [
    i
    for i in panel.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
    if driver.execute_script("return arguments[0].naturalWidth", i) > 0
  ]
  if images and shots is not None:
    for _ in range(2):  # the cells above take their height once in view: scroll, settle, again
      driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", images[0])
      time.sleep(0.5)
    images[0].screenshot(str(shots / f"{path.stem}.png"))

  # Save (Ctrl+S) and read back what Lab saved: the outputs, cell by cell.
  panel.find_element(By.CSS_SELECTOR, ".jp-Notebook").click()
  ActionChains(driver).key_down(Keys.CONTROL).send_keys("s").key_up(Keys.CONTROL).perform()

  def tab():
    return css(By.CSS_SELECTOR, ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")[0]

  _wait(lambda: "jp-mod-dirty" not in tab().get_attribute("class"), 60, f"{name} not saved")
  saved = json.loads((nbdir / ".ipynb" / f"{path.stem}.ipynb").read_text())
  code = [c for c in saved["cells"] if c["cell_type"] == "code"]
  for i, cell in enumerate(code):
    for out in cell.get("outputs", []):
      if out["output_type"] == "error":
        problems.append(f"code cell {i} raised {out['ename']}: {out['evalue']}"[:300])
  drawn = [
    i for i, c in enumerate(code) if any("image/png" in o.get("data", {}) for o in c["outputs"])
  ]
  expected = figure_cells(path.read_text())
  if missing := sorted(set(expected) - set(drawn)):
    problems.append(f"no figure under code cells {missing} (expected under {expected})")
  if len(images) < len(expected):
    problems.append(f"{len(images)} images rendered in the page, {len(expected)} expected")
  closing = "".join(
    "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
    for o in (code[-1]["outputs"] if code else [])
    if o["output_type"] != "error" and o.get("name") != "stderr"
  )
  if len(closing.strip()) < 40:
    problems.append(f"the closing cell printed no conclusion: {closing.strip()!r}")

  # Close the tab, end its kernel (as Kernel > Shut Down Kernel does); nothing tracked changed.
  tab().find_element(By.CSS_SELECTOR, ".lm-TabBar-tabCloseIcon").click()
  _wait(lambda: not [p for p in css(By.CSS_SELECTOR, ".jp-NotebookPanel") if p.is_displayed()],
        30, f"{name} did not close")  # fmt: skip
  lab.api("DELETE", f"/api/sessions/{session['id']}")
  if status := _git_status(nbdir.parent):
    problems.append(f"tracked files changed after a save and close: {status.strip()}")
  return {"problems": problems, "seconds": round(seconds, 1)}


_RAISES = (
  "# %% [markdown]\n# A notebook that fails: the browser test must report it.\n\n"
  "# %%\nimport matplotlib.pyplot as plt\n\nplt.show()\n\n"
  '# %%\nraise ValueError("injected")\n\n# %%\nprint("a conclusion that is never reached")\n'
)


@pytest.mark.skipif(_chromium() is None, reason="no chromium/chromedriver (apt-get install chromium chromium-driver)")  # fmt: skip
@pytest.mark.timeout(1800)  # 8 notebooks in small mode: 8 min beside other work on 2 cores
def test_each_notebook_runs_in_jupyterlab_in_a_browser(tmp_path):
  pytest.importorskip("selenium", reason="selenium is not installed (the dev extra)")
  nbdir = _copy_as_repository(tmp_path / "repo", {"00_raises.py": _RAISES})
  shots = ARTIFACTS
  shots.mkdir(parents=True, exist_ok=True)
  lab = Lab(nbdir, tmp_path / "home")
  browser = None
  results: dict[str, dict] = {}
  try:
    browser = Browser(tmp_path / "chromium")
    driver = browser.driver
    driver.get(lab.url)
    _wait(
      lambda: driver.find_elements("css selector", ".jp-DirListing-item"), 120, "Lab did not load"
    )
    for path in [nbdir / "00_raises.py", *NOTEBOOKS]:
      results[path.stem] = run_in_lab(
        driver, lab, nbdir, path, None if path.stem == "00_raises" else shots
      )
    # What the saves wrote (notebooks/.ipynb/, checkpoints) is not in the file browser.
    time.sleep(2)
    listed = [
      i.text.split("\n")[0] for i in driver.find_elements("css selector", ".jp-DirListing-item")
    ]
    assert sorted(listed) == sorted(p.name for p in nbdir.glob("*.py")), listed
    assert (nbdir / ".ipynb").is_dir()
  finally:
    driver_pid = browser.quit() if browser else None
    lab.stop()
    (shots / "times.json").write_text(json.dumps(results, indent=1) + "\n")
  print("\nsmall mode, Run All to idle:", {k: v["seconds"] for k, v in results.items()})

  # The check can fail: the notebook that raises is reported, with what it lacks.
  injected = "\n".join(results["00_raises"]["problems"])
  assert "ValueError: injected" in injected and "no figure" in injected, injected
  assert "closing cell printed no conclusion" in injected, injected
  failed = {k: v["problems"] for k, v in results.items() if k != "00_raises" and v["problems"]}
  assert not failed, json.dumps(failed, indent=1)
  # Nothing left running: the server, its kernels, Chromium and its driver.
  assert lab.proc.returncode is not None
  assert not _wait_until_gone(str(tmp_path)), "left running"
  assert driver_pid is None or not Path(f"/proc/{driver_pid}").exists(), "chromedriver left"
