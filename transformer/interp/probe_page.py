"""One page for what a probe run wrote (`launch.probe --out=DIR`): DIR/index.html shows every picture, links
every other page (features.html, graph.html) and every JSON file, the small ones' numbers folded out beside it,
folder by folder (several --text: one folder a text), under the command that made them.

    >>> probe_page.write(Path("probes/romeo"), "python -m launch.probe --workdir=... --text=...")
    PosixPath('probes/romeo/index.html')

It holds no copy of anything: the pictures and files are read from beside it, so it stays true while they do.
A picture the browser cannot load is replaced by a line naming the missing file.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

PAGE = "index.html"
SHOWN_JSON_BYTES = 16_384  # a JSON file up to this size is shown on the page; a larger one only linked

# A picture that does not load says so in its place; one that does records its size (what a browser check reads).
_SCRIPT = """
for (const img of document.querySelectorAll("img")) {
  const loaded = () => img.setAttribute("data-natural-width", img.naturalWidth);
  const missing = () => img.replaceWith(Object.assign(document.createElement("p"),
    {className: "missing", textContent: "missing: " + img.getAttribute("src")}));
  if (img.complete) { img.naturalWidth ? loaded() : missing(); }
  else { img.addEventListener("load", loaded); img.addEventListener("error", missing); }
}
"""

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
code { background: #f3f3f3; padding: 0.1em 0.3em; }
figure { margin: 1em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
pre { background: #f7f7f7; padding: 0.6em; max-height: 24em; overflow: auto; font-size: 12px; }
.missing { color: #b00; }
"""


def write(out: Path, command: str = "") -> Path:
  """Writes `out`/index.html over what `out` holds (pictures, pages, JSON files, in its subfolders too) and
  returns its path. `command`: the command line that wrote them, shown at the top."""
  out = Path(out)
  sections = []
  for folder in [out, *sorted(p for p in out.rglob("*") if p.is_dir())]:
    body = _section(out, folder)
    if body:
      heading = f"<h2>{html.escape(str(folder.relative_to(out)))}/</h2>" if folder != out else ""
      sections.append(heading + body)
  title = html.escape(f"probe: {out.resolve().name}")
  ran = f"<p>Written by <code>{html.escape(command)}</code></p>" if command else ""
  nothing = "" if sections else "<p>This run wrote no pictures or numbers here.</p>"
  page = (
    f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title><style>{_STYLE}</style></head>\n'
    f"<body><h1>{title}</h1>{ran}{nothing}{''.join(sections)}<script>{_SCRIPT}</script></body></html>\n"
  )
  path = out / PAGE
  path.write_text(page)
  return path


def _section(out: Path, folder: Path) -> str:
  """The pictures, pages and JSON files directly in `folder`, linked relative to `out`."""
  files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != PAGE)
  parts = []
  for p in files:
    link = html.escape(p.relative_to(out).as_posix(), quote=True)
    name = html.escape(p.name)
    if p.suffix == ".png":
      parts.append(f'<figure><img src="{link}" alt="{name}"><figcaption>{name}</figcaption></figure>')
    elif p.suffix == ".html":
      parts.append(f'<p>page: <a href="{link}">{name}</a></p>')
    elif p.suffix == ".json":
      named = f'numbers: <a href="{link}">{name}</a>'
      shown = _shown(p)
      parts.append(f"<details><summary>{named}</summary><pre>{shown}</pre></details>" if shown else f"<p>{named}</p>")
  return "".join(parts)


def _shown(path: Path) -> str:
  """A small JSON file's contents, indented and escaped ("" for a large one, or one that does not parse)."""
  if path.stat().st_size > SHOWN_JSON_BYTES:
    return ""
  try:
    return html.escape(json.dumps(json.loads(path.read_text()), indent=1))
  except ValueError:
    return ""
