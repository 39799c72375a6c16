"""Start and stop a local `anvil` dev chain, for tests and the local launcher.

Anvil's well-known dev mnemonic funds the accounts; `dev_accounts` derives their keys from it
rather than hard-coding them. These keys are public: never use them on a real chain.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import TracebackType

from eth_account import Account
from eth_account.signers.local import LocalAccount

import prime_swarm
from prime_swarm.libs.cli.lifecycle import die_with_parent

from .errors import ChainError

DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_CHAIN_ID = 31337
ANVIL_BIN_ENV = "PRIME_ANVIL_BIN"
# Where `make` installs the npm package `@foundry-rs/anvil-linux-amd64`.
REPO_ANVIL = (
    Path(prime_swarm.__file__).resolve().parent
    / ".tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
)


class AnvilError(ChainError):
    """Anvil could not be found or started."""


def find_anvil() -> Path:
    """The anvil binary: $PRIME_ANVIL_BIN, then the repo's npm install, then PATH."""
    env = os.environ.get(ANVIL_BIN_ENV)
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise AnvilError(f"{ANVIL_BIN_ENV}={env} is not an executable file")
        return path
    if REPO_ANVIL.is_file() and os.access(REPO_ANVIL, os.X_OK):
        return REPO_ANVIL
    found = shutil.which("anvil")
    if found:
        return Path(found)
    raise AnvilError(
        f"anvil not found: set {ANVIL_BIN_ENV}, run `make` to install it under .tools/, "
        "or put it on PATH"
    )


def dev_accounts(n: int = 10, mnemonic: str = DEV_MNEMONIC) -> list[LocalAccount]:
    """The first `n` accounts anvil funds for `mnemonic` (BIP-44 path m/44'/60'/0'/0/i)."""
    return [Account.from_key(_derive_key(mnemonic, i)) for i in range(n)]


@cache
def _derive_key(mnemonic: str, index: int) -> bytes:
    # Derivation is pure Python (~30 ms a key) and tests ask for the same keys many times.
    Account.enable_unaudited_hdwallet_features()
    account: LocalAccount = Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{index}")
    return bytes(account.key)


def free_port() -> int:
    # The port can be taken again before anvil binds it; `Anvil.start` retries on that.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rpc_ready(rpc_url: str, timeout: float = 1.0) -> bool:
    """True once the node answers a JSON-RPC request."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})
    req = urllib.request.Request(
        rpc_url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return "result" in json.loads(resp.read())
    except (OSError, urllib.error.URLError, ValueError):
        return False


def set_balance(rpc_url: str, address: str, wei: int, timeout: float = 10.0) -> None:
    """Give `address` exactly `wei` on a dev chain (anvil_setBalance). A dev-chain shortcut: on
    a real chain an operator or a contributor funds their own address."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "anvil_setBalance", "params": [address, hex(wei)]}
    )
    req = urllib.request.Request(
        rpc_url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise ChainError(f"anvil_setBalance on {rpc_url}: {exc}") from exc
    if "error" in reply:
        raise ChainError(f"anvil_setBalance on {rpc_url}: {reply['error']}")


class Anvil:
    """An anvil process (on 127.0.0.1 unless placed elsewhere); a context manager, or call
    start()/stop()."""

    def __init__(
        self,
        *,
        port: int | None = None,
        accounts: int = 10,
        balance_ether: int = 10_000,
        chain_id: int = DEV_CHAIN_ID,
        mnemonic: str = DEV_MNEMONIC,
        block_time: float | None = None,
        startup_timeout: float = 15.0,
        binary: Path | None = None,
        host: str = "127.0.0.1",
        argv_prefix: Sequence[str] = (),
        address: tuple[str, int] | None = None,
    ) -> None:
        """`argv_prefix` starts anvil elsewhere (`ip netns exec NS`: a host of a testbed),
        bound to `host` on `port`; `address` is then where others reach it."""
        self._fixed_port = port
        self.port = port or 0
        self.accounts = accounts
        self.balance_ether = balance_ether
        self.chain_id = chain_id
        self.mnemonic = mnemonic
        self.block_time = block_time
        self.startup_timeout = startup_timeout
        self.binary = binary
        self.host, self.argv_prefix, self.address = host, list(argv_prefix), address
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def rpc_url(self) -> str:
        host, port = self.address or ("127.0.0.1", self.port)
        return f"http://{host}:{port}"

    def dev_accounts(self, n: int | None = None) -> list[LocalAccount]:
        return dev_accounts(self.accounts if n is None else n, self.mnemonic)

    def start(self) -> Anvil:
        if self._proc is not None:
            raise AnvilError("anvil already started")
        binary = self.binary or find_anvil()
        # A free port can be grabbed by someone else before anvil binds it: retry a few times.
        attempts = 1 if self._fixed_port else 3
        last_error = ""
        for _ in range(attempts):
            self.port = self._fixed_port or free_port()
            last_error = self._try_start(binary)
            if not last_error:
                return self
        raise AnvilError(f"anvil did not start on {self.rpc_url}: {last_error}")

    def _try_start(self, binary: Path) -> str:
        """Start once; '' on success, else what went wrong (the process is cleaned up)."""
        cmd = [
            *self.argv_prefix,
            str(binary),
            "--host", self.host,
            "--port", str(self.port),
            "--accounts", str(self.accounts),
            "--balance", str(self.balance_ether),
            "--chain-id", str(self.chain_id),
            "--mnemonic", self.mnemonic,
            "--silent",
        ]  # fmt: skip
        if self.block_time is not None:
            cmd += ["--block-time", str(self.block_time)]
        # A file, not a pipe: nobody reads anvil's output while it runs, and a full pipe would
        # block it; the file is read back only to explain a failed start.
        self._log = tempfile.NamedTemporaryFile(prefix="anvil-", suffix=".log")
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # A crashed test run must not leave anvil behind (start it from a long-lived
            # thread: Linux signals when the starting *thread* exits).
            preexec_fn=die_with_parent(),
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                error = f"exited with code {self._proc.returncode}: {self._read_log()}"
                self.stop()
                return error
            if rpc_ready(self.rpc_url, timeout=0.5):
                return ""
            time.sleep(0.05)
        self.stop()
        return f"no JSON-RPC answer within {self.startup_timeout:.0f} s"

    def _read_log(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace").strip()[-2000:]

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Anvil:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
