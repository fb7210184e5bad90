"""Where agentkit keeps what it builds on first use (games, the default model)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``$AGENTKIT_CACHE``, else ``$XDG_CACHE_HOME/agentkit``, else ``~/.cache/agentkit``."""
    if os.environ.get("AGENTKIT_CACHE"):
        return Path(os.environ["AGENTKIT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentkit"


@contextlib.contextmanager
def build_folder_once(folder: Path, done_marker: str) -> Iterator[Path]:
    """Build ``folder`` atomically: yield a temporary sibling to fill, then rename it into place.

    Several processes may build the same cache entry at once: the first rename wins, and a loser's
    copy is dropped as long as the winner's ``done_marker`` file exists. A failure while building
    leaves no partial folder behind.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / done_marker).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
