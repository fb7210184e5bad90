"""Crash-safe JSONL for trajectories.

Appending writes one whole line per record, unbuffered, on a file opened for appending, so a crash
can leave at most one torn *last* line; a write that fails (the disk filling up) is undone, so the
file keeps whole lines (``DiskFullError`` says which file, the space left, what was kept). Opening
a file whose last line is torn moves that fragment to ``FILE.torn`` (it is reported, never
silently merged with the next record) before anything new is written. Reading validates every
line and names the file and line of any problem; a torn last line is reported and skipped, or
raises in strict mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from agentkit.core.errors import OutputExistsError, TrajectoryFormatError, disk_full, no_space
from agentkit.core.trajectory import Trajectory


class TornLineWarning(UserWarning):
    """A file ended in a partial line (a crash mid-write); the fragment was set aside."""


def _split_torn_tail(path: Path) -> bytes:
    """Return the bytes after the last newline (empty if the file ends cleanly)."""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return b""
        # walk back in chunks to the last newline
        pos, tail = size, b""
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return chunk[idx + 1 :] + tail
            tail = chunk + tail
        return tail


def append_whole(file: IO[bytes], data: bytes) -> None:
    """Write ``data`` at the end of an unbuffered ``file``, whole or not at all: a write cut short
    (the disk filling up) is undone before its ``OSError`` goes on."""
    start = file.tell()
    rest = memoryview(data)
    try:
        while rest:  # an unbuffered write may take only part of it
            rest = rest[file.write(rest):]
    except OSError:
        with contextlib.suppress(OSError):  # shrinking a file needs no space; if it fails, a read drops the torn line
            os.ftruncate(file.fileno(), start)
            file.seek(start)
        raise


class TrajectoryWriter:
    """Append-only writer. ``mode``: "new" (refuse an existing file), "append" or "overwrite"."""

    def __init__(self, path: str | os.PathLike, mode: str = "new") -> None:
        self.path = Path(path)
        if mode not in ("new", "append", "overwrite"):
            raise ValueError(f"mode must be 'new', 'append' or 'overwrite', got {mode!r}")
        if self.path.is_dir():
            raise OutputExistsError(f"Output path {self.path} is a directory; give a file name such as {self.path / 'trajectories.jsonl'}.")
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and mode == "new":
            raise OutputExistsError(
                f"Output file {self.path} already exists. Pass --append to add to it or --overwrite to replace it."
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if exists and mode == "append":
            torn = _split_torn_tail(self.path)
            if torn:
                self._set_aside(torn)
        if mode == "overwrite":
            # write the replacement beside the old file; it replaces the old one only on close()
            self._final_path: Path | None = self.path
            self.path = self.path.with_name(self.path.name + ".tmp")
            self._file: IO[bytes] = self.path.open("wb", buffering=0)
        else:
            self._final_path = None
            self._file = self.path.open("ab", buffering=0)  # unbuffered: each line is written whole or undone
        self.count = 0

    def _set_aside(self, torn: bytes) -> None:
        sidecar = self.path.with_name(self.path.name + ".torn")
        with sidecar.open("ab") as s:
            s.write(torn + b"\n")
        with self.path.open("r+b") as f:
            f.truncate(self.path.stat().st_size - len(torn))
        warnings.warn(
            f"{self.path} ended in a torn line ({len(torn)} bytes, from an interrupted write); "
            f"moved it to {sidecar} before appending.",
            TornLineWarning,
            stacklevel=3,
        )

    def write(self, trajectory: Trajectory) -> None:
        """Append one trajectory. It is checked first with the reader's own rules, so nothing is
        written that a read would refuse (``TrajectoryFormatError`` naming the episode otherwise)."""
        record = trajectory.to_dict()
        try:
            Trajectory.from_dict(record, where=f"episode {trajectory.id!r}")
        except TrajectoryFormatError as err:
            raise TrajectoryFormatError(f"Not written to {self._final_path or self.path}, since a read would refuse "
                                        f"it: {err} The episodes before it are in the file.") from err
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            append_whole(self._file, line.encode("utf-8") + b"\n")
        except OSError as err:
            raise self._write_error(err) from err
        self.count += 1

    def _write_error(self, err: OSError) -> OSError:
        if not no_space(err):
            return err
        written = f"{self.count} trajector{'y' if self.count == 1 else 'ies'}"
        kept = (f"{self._final_path} was not replaced; {self.path} holds the {written} written so far, whole."
                if self._final_path is not None else
                f"The file keeps whole lines only: the {written} written before, all intact.")
        return disk_full("trajectories to", self.path, err, f"{kept} Free some space there to go on.")

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            os.fsync(self._file.fileno())
        except OSError as err:
            self._file.close()
            raise self._write_error(err) from err
        self._file.close()
        if self._final_path is not None:
            os.replace(self.path, self._final_path)
            self.path = self._final_path

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self._final_path is not None:
            # an interrupted overwrite keeps the old file and the partial new one beside it
            self._file.close()
            return
        if exc_type is not None:
            with contextlib.suppress(OSError):  # the error on its way out says what went wrong, not a second one
                self.close()
            return
        self.close()


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON records of a log file of the run folder (metrics.jsonl, eval.jsonl), [] when it is absent."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def iter_trajectories(path: str | os.PathLike, *, strict: bool = False) -> Iterator[Trajectory]:
    """Yield validated trajectories from a JSONL file.

    A torn last line (no trailing newline, not valid JSON) is reported with a warning and
    skipped, or raises ``TrajectoryFormatError`` when ``strict``. Any other bad line raises,
    naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        raise TrajectoryFormatError(f"Trajectory file {path} does not exist.")
    with path.open("rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    ends_cleanly = data.endswith(b"\n") or not data
    if ends_cleanly:
        lines = lines[:-1]
    for lineno, raw in enumerate(lines, start=1):
        where = f"{path}:{lineno}"
        is_last = lineno == len(lines)
        if not raw.strip():
            if is_last and not ends_cleanly:
                continue
            raise TrajectoryFormatError(f"{where}: empty line.")
        try:
            record = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # also an integer too long to convert, nesting too deep
            if is_last and not ends_cleanly:
                msg = f"{where}: torn last line ({len(raw)} bytes, an interrupted write)"
                if strict:
                    raise TrajectoryFormatError(msg) from err
                warnings.warn(msg + "; skipped.", TornLineWarning, stacklevel=2)
                return
            raise TrajectoryFormatError(f"{where}: not valid JSON ({err}).") from err
        yield Trajectory.from_dict(record, where=where)


def read_trajectories(path: str | os.PathLike, *, strict: bool = False) -> list[Trajectory]:
    return list(iter_trajectories(path, strict=strict))


def read_complete_lines(path: str | os.PathLike) -> tuple[list[Trajectory], bytes]:
    """The trajectories on ``path``'s newline-terminated lines, and the bytes after its last newline.

    This is the file as ``TrajectoryWriter(path, mode="append")`` will leave it: the trailing
    bytes (empty when the file ends cleanly) are what it moves to ``FILE.torn``, even when they
    happen to parse (a record whose newline never reached the disk). Reads only; every complete
    line must validate, and any that does not raises, naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        raise TrajectoryFormatError(f"Trajectory file {path} does not exist.")
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # 0 when there is no newline at all: everything is the tail
    trajectories = []
    for lineno, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        where = f"{path}:{lineno}"
        if not raw.strip():
            raise TrajectoryFormatError(f"{where}: empty line.")
        try:
            record = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # also an integer too long to convert, nesting too deep
            raise TrajectoryFormatError(f"{where}: not valid JSON ({err}).") from err
        trajectories.append(Trajectory.from_dict(record, where=where))
    return trajectories, data[end:]


_STEP_FILE = re.compile(r"step-(\d+)\.jsonl$")


def step_files(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """A run folder's whole ``step-N.jsonl`` files in ``folder`` (trajectories/ or signals/), as
    (N, path) in step order; a step still being written (``.part``) is not one. None: []."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_FILE.search(p.name)))
