"""One command-line convention for every console script (libs/cli): flags from the settings
classes with their descriptions, defaults and variables; `--version`; the same names for the
same things; a bad value is one line naming the flag and its variable, exit code 2."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from prime_swarm.deploy.local import cli as swarm_cli
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.cli import FLAG_NAMES, add_settings, new_parser
from prime_swarm.libs.observability.logs import setup_logging
from prime_swarm.services.chain import cli as chain_cli
from prime_swarm.services.orchestrator import cli as orchestrator_cli
from prime_swarm.services.orchestrator.settings import OrchestratorSettings
from prime_swarm.services.relay import cli as relay_cli
from prime_swarm.services.relay.settings import RelaySettings
from prime_swarm.services.trainer import cli as trainer_cli
from prime_swarm.services.trainer.settings import TrainerSettings
from prime_swarm.services.validator import cli as validator_cli
from prime_swarm.services.validator.settings import ValidatorSettings
from prime_swarm.services.worker import cli as worker_cli
from prime_swarm.services.worker.settings import (
    WorkerChainSettings,
    WorkerKeySettings,
    WorkerSettings,
)

ADDR = "0x" + "ab" * 20
Main = Callable[[list[str]], Any]

SCRIPTS: dict[str, Main] = {
    "prime-worker": worker_cli.main,
    "prime-orchestrator": orchestrator_cli.main,
    "prime-validator": validator_cli.main,
    "prime-trainer": trainer_cli.main,
    "prime-relay": relay_cli.main,
    "prime-chain": chain_cli.main,
    "prime-swarm": swarm_cli.main,
}

# Every command whose flags come from a settings class: (script, argv before --help, class,
# fields with no flag there).
SETTINGS_COMMANDS: list[tuple[str, list[str], type[BaseSettings], set[str]]] = [
    ("prime-worker", ["join"], WorkerSettings, set()),
    ("prime-worker", ["leave"], WorkerChainSettings, set()),
    ("prime-worker", ["withdraw"], WorkerChainSettings, set()),
    ("prime-worker", ["address"], WorkerKeySettings, set()),
    ("prime-orchestrator", [], OrchestratorSettings, set()),
    ("prime-validator", [], ValidatorSettings, set()),
    ("prime-trainer", [], TrainerSettings, set()),
    ("prime-relay", ["origin"], RelaySettings, {"mode", *relay_cli.HIDDEN["origin"]}),
    ("prime-relay", ["relay"], RelaySettings, {"mode", *relay_cli.HIDDEN["relay"]}),
    ("prime-swarm", ["up"], LocalNetworkSettings, set()),
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No PRIME_* variable of the machine leaks in; wide help lines are never wrapped."""
    for var in list(os.environ):
        if var.startswith("PRIME_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("COLUMNS", "1000")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run(main: Main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def flat(text: str) -> str:
    return " ".join(text.split())


def is_nested(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


@pytest.mark.parametrize("script", SCRIPTS)
def test_version(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(SCRIPTS[script], ["--version"], capsys)
    assert code == 0
    assert out.strip() == f"{script} {version('prime-swarm')}"


@pytest.mark.parametrize(
    ("script", "argv", "cls", "hidden"),
    SETTINGS_COMMANDS,
    ids=[" ".join([s, *a]) for s, a, _, _ in SETTINGS_COMMANDS],
)
def test_help_shows_descriptions_defaults_and_variables(
    script: str,
    argv: list[str],
    cls: type[BaseSettings],
    hidden: set[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(SCRIPTS[script], [*argv, "--help"], capsys)
    assert code == 0
    text = flat(out)
    prefix = cls.model_config["env_prefix"]
    for name, info in cls.model_fields.items():
        env = f"[env: {prefix}{name.upper()}]"
        if name in hidden:
            assert env not in text, name
            continue
        if is_nested(info.annotation):  # environment only, named at the end
            assert f"{name} (" in text.split("Set by environment only:")[1], name
            continue
        assert flat(info.description or "") in text, name
        assert env in text, name
        if info.is_required():
            assert f"(required) {env}" in text, name
        else:
            default = info.default if info.default_factory is None else info.default_factory()
            assert f"(default: {default}) {env}" in text, name
    assert "PRIME_LOG_FORMAT" in text


@pytest.mark.parametrize(
    ("script", "argv", "line"),
    [
        (
            "prime-worker",
            ["join", "--pool", "0", "--ledger", ADDR],
            "prime-worker join: --pool: input should be greater than or equal to 1, got '0' "
            "(PRIME_WORKER_POOL_ID)",
        ),
        (
            "prime-worker",
            ["leave", "--pool", "x", "--ledger", ADDR],
            "prime-worker leave: --pool: input should be a valid integer, unable to parse "
            "string as an integer, got 'x' (PRIME_WORKER_POOL_ID)",
        ),
        (
            "prime-orchestrator",
            ["--pool", "1", "--ledger", ADDR, "--lease-spread", "0.5"],
            "prime-orchestrator: --lease-spread: input should be greater than or equal to 1, "
            "got '0.5' (PRIME_ORCH_LEASE_SPREAD)",
        ),
        (
            "prime-validator",
            ["--pool", "1", "--ledger", ADDR, "--key-file", "k", "--relay", "http://r"]
            + ["--batch-size", "0"],
            "prime-validator: --batch-size: input should be greater than or equal to 1, got '0' "
            "(PRIME_VALIDATOR_BATCH_SIZE)",
        ),
        (
            "prime-trainer",
            ["--origin-url", "http://o", "--key-file", "k", "--init-model-dir", "m"]
            + ["--checkpoint-dir", "c", "--max-steps", "0"],
            "prime-trainer: --max-steps: input should be greater than or equal to 1, got '0' "
            "(PRIME_TRAINER_MAX_STEPS)",
        ),
        (
            "prime-relay",
            ["origin", "--trainer", ADDR, "--port", "70000"],
            "prime-relay origin: --port: input should be less than or equal to 65535, "
            "got '70000' (PRIME_RELAY_PORT)",
        ),
        (
            "prime-swarm",
            ["up", "--backend", "hf,tpu"],
            "prime-swarm up: --backend: input should be 'hf' or 'vllm', got 'tpu' "
            "(PRIME_UP_WORKER_BACKENDS)",
        ),
        (
            "prime-worker",
            ["join", "--pool", "1", "--ledger", ADDR, "--log-level", "loud"],
            "prime-worker join: --log-level: input should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' "
            "or 'CRITICAL', got 'LOUD' (PRIME_WORKER_LOG_LEVEL)",
        ),
    ],
)
def test_bad_value_is_one_line_naming_flag_and_variable(
    script: str, argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(SCRIPTS[script], argv, capsys)
    assert code == 2
    assert err.splitlines() == [line]
    assert out == ""


def test_bad_variable_names_flag_and_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRIME_WORKER_POOL_ID", "0")
    code, _, err = run(worker_cli.main, ["withdraw", "--ledger", ADDR], capsys)
    assert code == 2
    assert err.splitlines() == [
        "prime-worker withdraw: --pool: input should be greater than or equal to 1, got '0' "
        "(PRIME_WORKER_POOL_ID)"
    ]
    monkeypatch.setenv("PRIME_RECIPE_GROUP_SIZE", "0")
    code, _, err = run(orchestrator_cli.main, ["--pool", "1", "--ledger", ADDR], capsys)
    assert code == 2
    assert err.splitlines() == [
        "prime-orchestrator: PRIME_RECIPE_GROUP_SIZE: input should be greater than or equal to 1, "
        "got '0'"
    ]


def test_missing_settings_are_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(orchestrator_cli.main, [], capsys)
    assert code == 2
    assert err.splitlines() == [
        "prime-orchestrator: --ledger: required (PRIME_ORCH_LEDGER_ADDRESS)",
        "prime-orchestrator: --pool: required (PRIME_ORCH_POOL_ID)",
    ]


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("prime-worker", ["join", "--no-such-flag"]),
        ("prime-worker", ["dance"]),
        ("prime-relay", ["origin", "--parent", "http://p"]),  # a relay-mode flag
        ("prime-orchestrator", ["--recipe.group-size", "4"]),  # nested: environment only
        ("prime-chain", ["pool-info", "--deployment", "d.json", "--pool", "0"]),
        ("prime-swarm", ["filter-tasks", "--out", "t.json", "--band", "0.9", "0.1"]),
    ],
)
def test_usage_errors_are_one_line(
    script: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(SCRIPTS[script], argv, capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"{script}"), err


SHARED = {
    "--pool": "pool_id",
    "--ledger": "ledger_address",
    "--rpc-url": "rpc_url",
    "--key-file": "key_file",
    "--redis-url": "redis_url",
    "--relay": "relays",
    "--trainer": "trusted_trainer",
}


@pytest.mark.parametrize(
    ("script", "argv", "cls", "hidden"),
    SETTINGS_COMMANDS,
    ids=[" ".join([s, *a]) for s, a, _, _ in SETTINGS_COMMANDS],
)
def test_the_same_thing_has_the_same_flag_everywhere(
    script: str,
    argv: list[str],
    cls: type[BaseSettings],
    hidden: set[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run(SCRIPTS[script], [*argv, "--help"], capsys)
    options = {word for line in out.splitlines() for word in line.split() if word[:2] == "--"}
    for flag, field in SHARED.items():
        if field in cls.model_fields and field not in hidden:
            assert flag in options, (flag, script, argv)
    for field, name in FLAG_NAMES.items():
        if field in cls.model_fields and field not in hidden:
            # The field's own spelling is still accepted, but not shown.
            assert f"--{name}" in options and f"--{field.replace('_', '-')}" not in options


def test_shared_flags_of_client_commands(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(chain_cli.main, ["deploy", "--help"], capsys)
    assert {"--rpc-url", "--key-file"} <= set(out.split())
    _, out, _ = run(chain_cli.main, ["pool-info", "--help"], capsys)
    assert {"--pool", "--rpc-url"} <= set(out.split())
    _, out, _ = run(relay_cli.main, ["fetch", "--help"], capsys)
    assert {"--relay", "--trainer"} <= set(out.split())


def test_old_spellings_still_parse_and_flags_beat_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRIME_ORCH_PORT", "9000")
    monkeypatch.setenv("PRIME_ORCH_HOST", "0.0.0.0")
    monkeypatch.setenv("PRIME_RECIPE_GROUP_SIZE", "4")
    parser = new_parser("prime-orchestrator", None)
    flags = add_settings(parser, OrchestratorSettings)
    argv = ["--pool-id", "3", "--ledger-address", ADDR, "--port", "9100"]
    s = flags.load(
        parser.parse_args([*argv, "--relays", "http://a,http://b", "--relay", "http://c"])
    )
    assert (s.pool_id, s.ledger_address, s.port, s.host) == (3, ADDR, 9100, "0.0.0.0")
    assert s.relays == ["http://a", "http://b", "http://c"]
    assert s.recipe.group_size == 4  # a nested settings class still reads its own variables
    assert type(s) is OrchestratorSettings

    parser = new_parser("prime-relay", None)
    sub = parser.add_subparsers(dest="mode")
    p = sub.add_parser("relay")
    relay = add_settings(
        p, RelaySettings, hide=relay_cli.HIDDEN["relay"], aliases=relay_cli.OLD_FLAGS
    )
    ns = parser.parse_args(
        [
            "relay",
            "--trainer",
            ADDR,
            "--parent",
            "http://o",
            "--timeout",
            "3",
            "--poll-interval",
            "2",
        ]
    )
    s = relay.load(ns, mode="relay")
    assert (s.request_timeout_s, s.poll_interval_s, s.parents) == (3.0, 2.0, ["http://o"])


def test_worker_address_reads_its_key_file_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "worker.json"
    monkeypatch.setenv("PRIME_WORKER_KEY_FILE", str(key))
    monkeypatch.setenv("PRIME_WORKER_PASSPHRASE", "test passphrase")
    worker_cli.main(["address"])
    address = capsys.readouterr().out.strip()
    assert key.exists() and address.startswith("0x") and len(address) == 42
    worker_cli.main(["address", "--key-file", str(key)])
    assert capsys.readouterr().out.strip() == address


# --- logs --------------------------------------------------------------------------------------


def test_text_logs_for_people_and_uvicorn_goes_through_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    monkeypatch.setenv("PRIME_LOG_FORMAT", "text")
    setup_logging("orchestrator")
    # What uvicorn.run does with log_config=None: levels only, no handler of its own.
    uvicorn.Config(app=lambda *_: None, log_config=None, log_level="info", access_log=False)
    logging.getLogger("uvicorn.error").info("Uvicorn running on %s", "http://127.0.0.1:8000")
    logging.getLogger("orchestrator").warning("lease expired", extra={"lease": "l-1"})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0][8:] == " INFO  orchestrator: Uvicorn running on http://127.0.0.1:8000"
    assert lines[1][8:] == " WARNING orchestrator: lease expired lease=l-1"
    assert lines[0][2] == lines[0][5] == ":"


def test_json_logs_when_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PRIME_LOG_FORMAT", raising=False)  # capsys' stderr is no terminal
    setup_logging("relay", mode="origin")
    logging.getLogger("uvicorn.error").info("started")
    record = json.loads(capsys.readouterr().err)
    assert record["service"] == "relay" and record["logger"] == "uvicorn.error"
    assert record["msg"] == "started" and record["mode"] == "origin"


# --- the console scripts themselves -------------------------------------------------------------


def _script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_console_scripts_answer_version_and_bad_values() -> None:
    proc = subprocess.run(
        [_script("prime-chain"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, f"prime-chain {version('prime-swarm')}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    proc = subprocess.run(
        [_script("prime-orchestrator"), "--pool", "-3", "--ledger", ADDR],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "prime-orchestrator: --pool: input should be greater than or equal to 1, got '-3' "
        "(PRIME_ORCH_POOL_ID)"
    ]


def test_a_service_whose_redis_is_gone_ends_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Past the retry budget, the validator and trainer exit 1 with one line naming Redis,
    host and port only, never the URL's password and never a traceback."""
    import redis

    from prime_swarm.libs.streams.connection import exit_when_redis_is_gone

    with pytest.raises(SystemExit) as ended, exit_when_redis_is_gone("prime-validator"):
        raise redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("prime-validator: Redis did not come back")
    assert "10.0.0.5:6379" in err and "Traceback" not in err


def test_a_wrong_redis_password_is_named_not_called_an_outage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import redis

    from prime_swarm.libs.streams.connection import exit_when_redis_is_gone

    with pytest.raises(SystemExit) as ended, exit_when_redis_is_gone("prime-trainer"):
        raise redis.AuthenticationError("invalid username-password pair or user is disabled.")
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "user or password in the Redis URL" in err
