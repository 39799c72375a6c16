"""prime-relay argument and settings handling (no server is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_swarm.services.relay.cli import build_parser, main
from prime_swarm.services.relay.settings import RelaySettings

ADDR = "0x" + "ab" * 20


def test_relay_mode_without_parent_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["relay", "--port", "0", "--trainer", ADDR])
    assert exc.value.code == 2
    assert "parent" in capsys.readouterr().err


def test_bad_trainer_address_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["origin", "--trainer", "not-an-address"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("prime-relay origin: --trainer: ")


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRIME_RELAY_TRUSTED_TRAINER", ADDR)
    monkeypatch.setenv("PRIME_RELAY_KEEP_VERSIONS", "7")
    monkeypatch.setenv("PRIME_RELAY_PARENTS", '["http://a:1"]')
    args = vars(
        build_parser().parse_args(
            [
                "relay",
                "--data-dir",
                str(tmp_path),
                "--parent",
                "http://b:2",
                "--parent",
                "http://c:3",
            ]
        )
    )
    s = RelaySettings(**{k: v for k, v in args.items() if v is not None})
    assert s.mode == "relay" and s.keep_versions == 7 and s.host == "127.0.0.1"
    assert s.parents == ["http://b:2", "http://c:3"] and s.data_dir == tmp_path
