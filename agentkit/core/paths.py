"""Where agentkit keeps what it builds on first use (games, the default model)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$AGENTKIT_CACHE``, else ``$XDG_CACHE_HOME/agentkit``, else ``~/.cache/agentkit``."""
    if os.environ.get("AGENTKIT_CACHE"):
        return Path(os.environ["AGENTKIT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentkit"
