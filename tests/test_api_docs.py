"""The API reference builds from the docstrings (pdoc) and its links resolve."""

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pdoc

from allreduce_jax.tools import API_MODULES


class _Links(HTMLParser):
  def __init__(self):
    super().__init__()
    self.hrefs: list[str] = []
    self.ids: set[str] = set()

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if attrs.get("id"):
      self.ids.add(attrs["id"])
    if tag == "a" and attrs.get("href"):
      self.hrefs.append(attrs["href"])


def _parse(path: Path) -> _Links:
  links = _Links()
  links.feed(path.read_text())
  return links


def test_api_reference_builds_and_every_link_resolves(tmp_path):
  pdoc.pdoc(*API_MODULES, output_directory=tmp_path)
  pages = sorted(tmp_path.rglob("*.html"))
  names = {p.relative_to(tmp_path).with_suffix("").as_posix().replace("/", ".") for p in pages}
  assert set(API_MODULES) <= names, set(API_MODULES) - names
  parsed = {p: _parse(p) for p in pages}
  broken = []
  for page, links in parsed.items():
    for href in links.hrefs:
      url = urlsplit(href)
      if url.scheme or href.startswith("//"):
        continue  # outside links (pdoc's own, the JAX docs) are not ours to check
      target = (page.parent / url.path).resolve() if url.path else page
      if not target.exists():
        broken.append(f"{page.name}: {href}")
      elif url.fragment and target.suffix == ".html":
        ids = (parsed.get(target) or _parse(target)).ids
        if url.fragment not in ids:
          broken.append(f"{page.name}: {href} (no #{url.fragment})")
  assert not broken, broken[:20]
  assert "all_reduce" in (tmp_path / "allreduce_jax.html").read_text()
