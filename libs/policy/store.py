"""Download a signed policy version through SHARDCAST relays and keep the last few loaded.

Workers and validators share this: both must hold the exact announced weights, verified against
the trainer's signature, never trusting the relay that served them.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.io import load_pretrained, load_weights_like
from prime_swarm.libs.shardcast.client import HeldFiles, download_version, fetch_manifest
from prime_swarm.libs.shardcast.errors import NotAvailableError
from prime_swarm.libs.shardcast.relays import RelayPool
from prime_swarm.protocol.messages import Manifest

log = logging.getLogger("policy")
RELAY_EVENT_LEVELS = {"ok": logging.DEBUG, "miss": logging.INFO}

ProgressFn = Callable[[int, int], None]


@dataclass
class LoadedPolicy:
    version: int
    model_hash: str
    lm: CausalLM
    manifest: Manifest | None = None
    """The signed manifest its files were verified against (None when not downloaded)."""


class PolicyError(RuntimeError):
    pass


class PolicyStore:
    def __init__(
        self,
        cache_dir: Path,
        trusted_trainer: str,
        keep: int = 3,
        timeout_s: float = 60.0,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        keep_loaded: int | None = None,
    ) -> None:
        """`keep` versions stay on disk (parents of the next deltas), `keep_loaded` (default:
        `keep`) of them in memory: a validator checks work of several versions at once; a worker
        generates with one, and each further model it held was a copy of the weights (14 GB at
        7B in bf16)."""
        self.cache_dir, self.trusted_trainer = Path(cache_dir), trusted_trainer
        self.keep, self.timeout_s = keep, timeout_s
        self.keep_loaded = min(keep, keep_loaded or keep)
        self.dtype, self.device = dtype, device
        self._loaded: OrderedDict[int, LoadedPolicy] = OrderedDict()
        # Verified on disk and not loaded: not yet, or no longer.
        self._downloaded: dict[int, Manifest] = {}
        self._lock = threading.Lock()
        self._relays: RelayPool | None = None
        self._fetching: threading.Thread | None = None
        self._not_yet: set[int] = set()  # versions a prefetch found on no relay yet
        self._closing = threading.Event()

    def relay_pool(self, urls: list[str]) -> RelayPool:
        """One pool per relay list, so a relay demoted for bad bytes stays demoted."""
        if self._relays is None or sorted(self._relays.urls) != sorted(urls):
            self._relays = RelayPool(urls, on_event=self._relay_event)
        return self._relays

    @staticmethod
    def _relay_event(kind: str, url: str, reason: str) -> None:
        # A served shard is routine and a miss is a relay still fetching the version; a
        # relay that failed or served bad bytes (demoted, never trusted again) is news.
        level = RELAY_EVENT_LEVELS.get(kind, logging.WARNING)
        log.log(level, "relay %s: %s", kind, reason, extra={"fields": {"relay": url}})

    def download(
        self,
        version: int,
        relays: list[str],
        progress: ProgressFn | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Fetch and verify `version`'s files into the cache without loading them. Safe on a
        background thread: loading is not (transformers switches torch's process-wide default
        dtype while it builds a model, which breaks a generation running meanwhile)."""
        with self._lock:
            if version in self._loaded or version in self._downloaded:
                return
        target = self.cache_dir / f"v{version}"
        try:
            pool = self.relay_pool(relays)
            signed = fetch_manifest(pool, version, self.trusted_trainer, self.timeout_s)
            download_version(
                pool,
                version,
                target,
                self.trusted_trainer,
                timeout_s=self.timeout_s,
                deadline_s=self.timeout_s * 10,
                progress=progress,
                manifest=signed,
                overwrite=True,
                held=self._held_files(version),
                stop=stop,
            )
        except Exception as exc:
            raise PolicyError(f"could not fetch policy v{version}: {exc}") from exc
        with self._lock:
            self._downloaded[version] = signed.manifest
            self._not_yet.discard(version)

    def _held_files(self, version: int) -> HeldFiles | None:
        """The newest version on disk before `version`: its unchanged files are linked, not
        fetched again."""
        with self._lock:
            on_disk = dict(self._downloaded) | {
                v: p.manifest for v, p in self._loaded.items() if p.manifest is not None
            }
        older = [v for v in on_disk if v < version]
        if not older:
            return None
        return HeldFiles(self.cache_dir / f"v{max(older)}", on_disk[max(older)])

    def prefetch(self, version: int, relays: list[str]) -> threading.Thread | None:
        """Download `version` on a background thread, one download at a time; the thread
        doing it (or the one still busy with an earlier version), None when nothing is to do.
        A failure is logged: the next `get` tries again and raises."""
        with self._lock:
            busy = self._fetching
            if busy is not None and busy.is_alive():
                return busy
            if self._closing.is_set() or version in self._loaded or version in self._downloaded:
                return None

            def fetch() -> None:
                try:
                    self.download(version, relays, stop=self._closing)
                except PolicyError as exc:
                    if not self._closing.is_set():
                        self._prefetch_failed(version, exc)

            self._fetching = threading.Thread(target=fetch, name="policy-prefetch", daemon=True)
            self._fetching.start()
            return self._fetching

    def close(self) -> None:
        """Cancel a prefetch in flight and wait for its thread. A daemon thread still running
        when the interpreter finalizes is killed inside whatever native call it is in, which
        can abort the process ("terminate called without an active exception") after a clean
        stop."""
        self._closing.set()
        with self._lock:
            busy = self._fetching
        if busy is not None:
            busy.join()

    def _prefetch_failed(self, version: int, exc: PolicyError) -> None:
        """A version announced before the relays hold it is routine (they poll their parents):
        said once per version, then only in debug logs, as the prefetch is tried again on
        every loop until it lands. Anything else is a warning each time."""
        if not isinstance(exc.__cause__, NotAvailableError):
            log.warning("%s; keeping the held version", exc)
            return
        first = version not in self._not_yet
        self._not_yet.add(version)
        log.log(
            logging.INFO if first else logging.DEBUG,
            "policy v%d not on the relays yet; keeping the held version",
            version,
            extra={"fields": {"detail": str(exc.__cause__)[:300]}},
        )

    def is_downloaded(self, version: int) -> bool:
        with self._lock:
            return version in self._downloaded or version in self._loaded

    def get(
        self, version: int, relays: list[str], progress: ProgressFn | None = None
    ) -> LoadedPolicy:
        """`version` loaded, downloading it first unless `download` already did."""
        with self._lock:
            if version in self._loaded:
                self._loaded.move_to_end(version)
                return self._loaded[version]
            busy = self._fetching
        if busy is not None:
            busy.join()  # never two downloads into one version's directory
        self.download(version, relays, progress)
        with self._lock:
            manifest = self._downloaded.pop(version)
        target = self.cache_dir / f"v{version}"
        try:
            held = self.latest_loaded()
            lm = (load_weights_like(held.lm, target) if held else None) or load_pretrained(
                target, dtype=self.dtype, device=self.device
            )
        except (OSError, ValueError) as exc:
            raise PolicyError(f"policy v{version} does not load: {exc}") from exc
        policy = LoadedPolicy(version, manifest.model_hash, lm, manifest)
        with self._lock:
            self._loaded[version] = policy
            self._loaded.move_to_end(version)
            # Out of memory beyond `keep_loaded` (work still being proved holds its model
            # until it is done), still on disk.
            while len(self._loaded) > self.keep_loaded:
                old, gone = self._loaded.popitem(last=False)
                if gone.manifest is not None:
                    self._downloaded[old] = gone.manifest
            # On disk: every loaded version, and the newest of the rest (parents of the next
            # deltas, or versions downloaded ahead) up to `keep` in all. A version downloaded
            # but skipped, because a newer one was loaded first, goes once enough newer ones are.
            room = max(0, self.keep - len(self._loaded))
            for old in sorted(self._downloaded, reverse=True)[room:]:
                del self._downloaded[old]
                shutil.rmtree(self.cache_dir / f"v{old}", ignore_errors=True)
        log.info("policy loaded", extra={"fields": {"version": version}})
        return policy

    def latest_loaded(self) -> LoadedPolicy | None:
        with self._lock:
            if not self._loaded:
                return None
            return self._loaded[max(self._loaded)]
