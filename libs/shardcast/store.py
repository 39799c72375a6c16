"""On-disk store of policy versions, shared by the origin and the relays.

Layout under `root`:

    v<N>/manifest.json         the SignedManifest as received (already verified by the caller)
    v<N>/shards/<file>/<i>     one file per shard, so it can be served with sendfile-style I/O
    v<N>/COMPLETE              present once every shard is held; only then is v<N> listed
                               (before that it is listed as partial, and its held shards are
                               already served: cut-through relaying)

Every write lands in a temporary name in the destination directory and is renamed into place,
so a reader (or a crash) never sees a half-written manifest or shard. A version directory is
created by renaming a staged directory that already holds its manifest, so `v<N>` without a
manifest never exists.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Literal

from prime_swarm.protocol.messages import FileEntry, ShardInfo, SignedManifest

from .errors import ShardcastError, UnsafeNameError
from .manifest import check_file_name, check_layout, find_file, served_files
from .verify import ShardVerifier

_VERSION_DIR = re.compile(r"^v(0|[1-9][0-9]{0,17})$")
_MANIFEST = "manifest.json"
_COMPLETE = "COMPLETE"
_SHARDS = "shards"

WriterState = Literal["writing", "committed", "failed"]
ShardKey = tuple[int, str, int]  # (version, file name, shard index)


class NotHeldError(ShardcastError, LookupError):
    """The store has no such version, file or shard (never held, or evicted)."""


class VersionConflictError(ShardcastError):
    """A complete version already exists with a different manifest."""


class ShardWriter:
    """Receives one shard's bytes; only `commit()` after full verification makes them visible.

    While it writes, a relay may already stream the received prefix downstream (byte-level
    cut-through, see `follow.py`): `readable` is how many bytes the temporary file holds,
    `generation` changes when they are thrown away (`reset`), and `state` says how it ended.
    Those bytes are unverified; every downstream reader hashes the shard itself.
    """

    def __init__(
        self,
        final: Path,
        shard: ShardInfo,
        on_commit: Callable[[], None] | None = None,
        on_close: Callable[[ShardWriter], None] | None = None,
    ) -> None:
        self.final = final
        self.shard = shard
        self._on_commit = on_commit
        self._on_close = on_close
        self._verifier = ShardVerifier(shard)
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
        self.tmp_path = Path(tmp)
        self._fh = os.fdopen(fd, "wb")
        self._done = False
        self.readable = 0
        self.generation = 0
        self.state: WriterState = "writing"

    @property
    def received(self) -> int:
        return self._verifier.received

    def write(self, chunk: bytes) -> None:
        self._verifier.update(chunk)  # raises before an oversized chunk touches the disk
        self._fh.write(chunk)
        # Flushed so a cut-through reader of the temporary file sees every byte counted here.
        self._fh.flush()
        self.readable = self._verifier.received

    def reset(self) -> None:
        """Drop what was received so far (the shard is fetched again from its start)."""
        # Generation first: a reader that read before the truncate still checks it afterwards.
        self.generation += 1
        self.readable = 0
        self._fh.seek(0)
        self._fh.truncate()
        self._verifier = ShardVerifier(self.shard)

    def commit(self) -> None:
        try:
            self._verifier.finish()
            self._fh.close()
            # No fsync: a torn shard after a power loss is caught by every downloader's hash
            # check, and syncing each shard would cost more than it protects.
            os.replace(self.tmp_path, self.final)
            self.state = "committed"
        except FileNotFoundError as exc:
            raise NotHeldError("version was evicted while the shard was being written") from exc
        finally:
            self.abort()
        if self._on_commit is not None:
            self._on_commit()

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        if self.state == "writing":
            self.state = "failed"
        self._fh.close()
        self.tmp_path.unlink(missing_ok=True)
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


class VersionStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._manifests: dict[int, SignedManifest] = {}
        # Per version, the shards not held yet: found by one scan of the disk, then kept up to
        # date as writers commit. Scanning after every shard (as an upload or a pull completes
        # each) made a version's arrival quadratic in its shard count: 512 shards took 52 s
        # instead of 15 s on loopback.
        self._missing: dict[int, set[tuple[str, int]]] = {}
        # Shards being written now, for cut-through readers (the newest writer of each wins).
        self._writing: dict[ShardKey, ShardWriter] = {}
        self._cleanup_leftovers()

    # ------------------------------------------------------------ paths

    def version_dir(self, version: int) -> Path:
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise UnsafeNameError(f"bad version {version!r}")
        return self.root / f"v{version}"

    def shard_path(self, version: int, name: str, index: int) -> Path:
        check_file_name(name)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise UnsafeNameError(f"bad shard index {index!r}")
        path = self.version_dir(version) / _SHARDS / name / str(index)
        # Defence in depth: whatever slipped past the name checks must still land under root.
        if self.root not in path.resolve().parents:
            raise UnsafeNameError(f"{name!r} resolves outside the store")
        return path

    # ------------------------------------------------------------ manifests

    def get_manifest(self, version: int) -> SignedManifest | None:
        cached = self._manifests.get(version)
        if cached is not None:
            return cached
        path = self.version_dir(version) / _MANIFEST
        try:
            signed = SignedManifest.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        self._manifests[version] = signed
        return signed

    def put_manifest(self, signed: SignedManifest) -> bool:
        """Hold a (verified) manifest; True if it is new.

        An identical manifest is a no-op, so uploads can be retried. A different manifest replaces
        an incomplete version (the trainer restarted mid-upload) but never a complete one.
        """
        check_layout(signed.manifest)
        version = signed.manifest.version
        with self._lock:
            current = self.get_manifest(version)
            if current == signed:
                return False
            if current is not None and self.is_complete(version):
                raise VersionConflictError(f"version {version} is complete with another manifest")
            staged = Path(tempfile.mkdtemp(dir=self.root, prefix=f".staging-v{version}-"))
            _write_atomic(staged / _MANIFEST, signed.model_dump_json().encode())
            if current is not None:
                self._remove_dir(self.version_dir(version))
            os.rename(staged, self.version_dir(version))
            self._manifests[version] = signed
            self._missing.pop(version, None)
            self._link_unchanged(signed)
            return True

    def _link_unchanged(self, signed: SignedManifest) -> None:
        """Hard-link every shard of `signed` that a complete held version has byte for byte
        (same file, index and hash): most files of a policy version (config, tokenizer) never
        change, and neither the origin's upload nor a relay's pull should move them again.
        The held copy is hashed again first: bytes that rotted on disk since they were checked
        in must not spread to a new version (a local read is far cheaper than the transfer)."""
        wanted = {
            (f.name, s.index): s.sha256 for f in served_files(signed.manifest) for s in f.shards
        }
        version = signed.manifest.version
        for held in reversed(self.versions()):
            old = self.get_manifest(held)
            if held == version or old is None:
                continue
            for f in served_files(old.manifest):
                for s in f.shards:
                    key = (f.name, s.index)
                    if wanted.get(key) != s.sha256:
                        continue
                    source = self.shard_path(held, f.name, s.index)
                    if not _holds(source, s):
                        continue  # missing (evicted meanwhile) or rotted: fetched as usual
                    target = self.shard_path(version, f.name, s.index)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(source, target)
                    except FileExistsError:
                        pass
                    except FileNotFoundError:
                        continue
                    del wanted[key]
            if not wanted:
                break

    # ------------------------------------------------------------ shards

    def locate(self, version: int, name: str, index: int) -> tuple[FileEntry, ShardInfo]:
        signed = self.get_manifest(version)
        if signed is None:
            raise NotHeldError(f"version {version} is not held")
        entry = find_file(signed.manifest, name)
        if entry is None:
            raise NotHeldError(f"version {version} has no file {name!r}")
        if not 0 <= index < len(entry.shards):
            raise NotHeldError(f"file {name!r} has {len(entry.shards)} shards, not index {index}")
        return entry, entry.shards[index]

    def has_shard(self, version: int, name: str, index: int) -> bool:
        return self.shard_path(version, name, index).is_file()

    def open_shard_writer(self, version: int, name: str, index: int) -> ShardWriter:
        _, shard = self.locate(version, name, index)
        final = self.shard_path(version, name, index)
        try:
            # No parents=True: if the version was evicted meanwhile this must fail rather than
            # resurrect a version directory without a manifest.
            final.parent.parent.mkdir(exist_ok=True)
            final.parent.mkdir(exist_ok=True)
        except FileNotFoundError as exc:
            raise NotHeldError(f"version {version} was evicted") from exc
        key = (version, name, index)

        def closed(writer: ShardWriter) -> None:
            with self._lock:
                if self._writing.get(key) is writer:
                    del self._writing[key]

        writer = ShardWriter(
            final, shard, on_commit=lambda: self._held(version, name, index), on_close=closed
        )
        with self._lock:
            self._writing[key] = writer
        return writer

    def writer_of(self, version: int, name: str, index: int) -> ShardWriter | None:
        """The writer still receiving this shard, if any (for byte-level cut-through)."""
        return self._writing.get((version, name, index))

    def _held(self, version: int, name: str, index: int) -> None:
        with self._lock:
            missing = self._missing.get(version)
            if missing is not None:
                missing.discard((name, index))

    def _missing_set(self, version: int) -> set[tuple[str, int]]:
        with self._lock:
            missing = self._missing.get(version)
            if missing is None:
                signed = self.get_manifest(version)
                if signed is None:
                    raise NotHeldError(f"version {version} is not held")
                missing = {
                    (f.name, s.index)
                    for f in served_files(signed.manifest)
                    for s in f.shards
                    if not self.has_shard(version, f.name, s.index)
                }
                self._missing[version] = missing
            return missing

    def missing_count(self, version: int) -> int:
        return len(self._missing_set(version))

    def missing_shards(self, version: int) -> list[tuple[FileEntry, ShardInfo]]:
        with self._lock:
            missing = set(self._missing_set(version))
            signed = self.get_manifest(version)
        assert signed is not None  # _missing_set raised otherwise
        return [
            (f, s)
            for f in served_files(signed.manifest)
            for s in f.shards
            if (f.name, s.index) in missing
        ]

    # ------------------------------------------------------------ completeness and listing

    def is_complete(self, version: int) -> bool:
        return (self.version_dir(version) / _COMPLETE).is_file()

    def mark_complete(self, version: int) -> bool:
        """Mark the version complete if every shard is held; True if it is (now) complete."""
        with self._lock:
            if self.is_complete(version):
                return True
            if self.missing_count(version):
                return False
            _write_atomic(self.version_dir(version) / _COMPLETE, b"")
            return True

    def held_versions(self) -> list[int]:
        """Every version with a manifest, complete or not."""
        found = []
        for entry in self.root.iterdir():
            m = _VERSION_DIR.match(entry.name)
            if m and entry.is_dir():
                found.append(int(m.group(1)))
        return sorted(found)

    def versions(self) -> list[int]:
        """Complete versions, oldest first: the ones a relay lists."""
        return [v for v in self.held_versions() if self.is_complete(v)]

    def partial_versions(self) -> list[int]:
        """Versions whose manifest is held but not every shard yet: served shard by shard."""
        return [v for v in self.held_versions() if not self.is_complete(v)]

    def latest(self) -> int | None:
        complete = self.versions()
        return complete[-1] if complete else None

    def evict(self, keep: int) -> list[int]:
        """Keep the newest `keep` complete versions (and newer partial ones); return the evicted."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        with self._lock:
            complete = self.versions()
            kept = complete[-keep:]
            floor = kept[0] if kept else None
            evicted = [
                v
                for v in self.held_versions()
                if (v in complete and v not in kept)
                or (v not in complete and floor is not None and v < floor)
            ]
            for v in evicted:
                self._remove_dir(self.version_dir(v))
                self._manifests.pop(v, None)
                self._missing.pop(v, None)
            return evicted

    # ------------------------------------------------------------ housekeeping

    def _remove_dir(self, path: Path) -> None:
        # Rename first so a half-deleted directory never looks like a version.
        trash = Path(tempfile.mkdtemp(dir=self.root, prefix=".trash-"))
        try:
            os.rename(path, trash / "x")
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)

    def _cleanup_leftovers(self) -> None:
        for entry in self.root.iterdir():
            if entry.name.startswith((".staging-", ".trash-")):
                shutil.rmtree(entry, ignore_errors=True)
        for tmp in self.root.glob("v*/shards/*/.*.tmp"):
            tmp.unlink(missing_ok=True)


def _holds(path: Path, shard: ShardInfo) -> bool:
    """Whether `path` still holds exactly `shard`'s bytes (the check every write goes through)."""
    verifier = ShardVerifier(shard)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                verifier.update(chunk)
        verifier.finish()
    except (FileNotFoundError, ShardcastError):
        return False
    return True


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # small and rare: worth making the listing durable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
