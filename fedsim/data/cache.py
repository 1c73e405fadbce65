"""On-disk cache of built domains: ``<cache_dir>/<name>.npz`` with a checksum inside.

    save_arrays(cache_dir, "digits-v1-mnist-seed0", {"train_x": ..., "train_y": ...})
    arrays = load_arrays(cache_dir, "digits-v1-mnist-seed0")  # None: missing or corrupt, rebuild

The checksum is a sha256 over the arrays' names, dtypes, shapes and bytes (not
over the zip file, whose timestamps differ between writes), stored in the npz
itself as ``__sha256__``: one file, replaced atomically, so two processes
building the same cache at once simply write the same content twice.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

logger = logging.getLogger(__name__)

CHECKSUM_KEY = "__sha256__"


def cache_path(cache_dir: str | os.PathLike, name: str) -> Path:
    return Path(cache_dir) / f"{name}.npz"


def checksum(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 of the arrays' names, dtypes, shapes and contents, in sorted key order."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        arr = np.ascontiguousarray(arrays[key])
        digest.update(key.encode("utf-8") + b"\0")
        digest.update(arr.dtype.str.encode("ascii") + b"\0")
        digest.update(repr(tuple(arr.shape)).encode("ascii") + b"\0")
        digest.update(arr.tobytes())
    return digest.hexdigest()


def save_arrays(cache_dir: str | os.PathLike, name: str, arrays: Mapping[str, np.ndarray]) -> Optional[Path]:
    """Write ``arrays`` to ``<cache_dir>/<name>.npz`` atomically; return the path.

    A cache that cannot be written (read-only or full disk) is not an error:
    it is logged and ``None`` returned, the caller keeps its arrays in memory.
    """
    if CHECKSUM_KEY in arrays:
        raise ValueError(f"array name {CHECKSUM_KEY!r} is reserved")
    target = cache_path(cache_dir, name)
    tmp_name = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            payload = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
            payload[CHECKSUM_KEY] = np.array(checksum(payload))
            np.savez_compressed(fh, **payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; a cache is shared like any built file
        os.replace(tmp_name, target)
        tmp_name = None
        _fsync_dir(target.parent)
        return target
    except OSError as exc:
        logger.warning("could not write cache %s (%s); continuing without it", target, exc)
        return None
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass


def load_arrays(cache_dir: str | os.PathLike, name: str) -> Optional[dict[str, np.ndarray]]:
    """Arrays saved by :func:`save_arrays`, or ``None`` if missing, unreadable or corrupt."""
    path = cache_path(cache_dir, name)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except Exception as exc:  # any unreadable file (bad zip, truncated, bad header) means: rebuild
        logger.warning("cache %s is unreadable (%s: %s); rebuilding it", path, type(exc).__name__, exc)
        return None
    stored = arrays.pop(CHECKSUM_KEY, None)
    if stored is None or stored.shape != () or str(stored) != checksum(arrays):
        logger.warning("cache %s fails its checksum; rebuilding it", path)
        return None
    return arrays


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable where the platform allows it (not on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
