"""The offline filter: pass rates under a policy (libs/rollout/evaluate.py), the band kept and
the task list file (libs/environments/task_lists.py), and `prime-swarm filter-tasks`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from prime_swarm.deploy.local.cli import main
from prime_swarm.libs.environments import Env, load_env
from prime_swarm.libs.environments.task_lists import (
    MAX_TASK_FILE_BYTES,
    histogram,
    keep_band,
    load_task_list,
    save_task_list,
)
from prime_swarm.libs.model.backend import Generation
from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.rollout.evaluate import pass_rates

ENV = load_env("reverse")
TASK_IDS = [t.task_id for t in ENV.sample_tasks(7, 4, "train")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(0, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def lm(model_dir: Path) -> CausalLM:
    return load_pretrained(model_dir)


def _pool(*names: str) -> dict[str, Env]:
    """A pool's environments, as the orchestrator holds them."""
    return {name: load_env(name) for name in names}


def _save(path: Path, env: str = "reverse", ids: Sequence[str] = TASK_IDS) -> Path:
    rates = {t: 0.5 for t in ids}
    return save_task_list(
        path, env=env, band=(0.1, 0.8), samples=4, policy="m", rates=rates, keep=list(ids)
    )


def test_keep_band_is_inclusive_and_sorted() -> None:
    rates = {"b": 0.1, "a": 0.8, "c": 0.05, "d": 0.85, "e": 0.5}
    assert keep_band(rates, 0.1, 0.8) == ["a", "b", "e"]
    assert keep_band(rates, 0.0, 1.0) == ["a", "b", "c", "d", "e"]
    assert keep_band(rates, 0.9, 1.0) == []


def test_histogram_puts_one_in_the_last_bin() -> None:
    assert histogram({"a": 0.0, "b": 0.19, "c": 0.2, "d": 0.99, "e": 1.0}) == [2, 1, 0, 0, 2]


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = _save(tmp_path / "sub" / "tasks.json")
    assert load_task_list(path, _pool("reverse")) == ("reverse", TASK_IDS)
    doc = json.loads(path.read_text())
    assert doc["env"] == "reverse" and doc["band"] == [0.1, 0.8] and doc["samples"] == 4
    assert doc["tasks"][0] == {"task_id": TASK_IDS[0], "pass_rate": 0.5}
    assert [p.name for p in path.parent.iterdir()] == ["tasks.json"]  # no tmp left behind


def test_load_refuses_another_env(tmp_path: Path) -> None:
    path = _save(tmp_path / "t.json")
    with pytest.raises(ValueError, match="lists 'reverse' tasks, but the pool's env is 'arith'"):
        load_task_list(path, _pool("arith"))


def test_load_refuses_an_oversize_file_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as f:
        f.truncate(MAX_TASK_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match="over the .* byte limit"):
        load_task_list(path, _pool("reverse"))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not a task list"),
        ('{"env": "reverse"}', "not a task list: band"),
        (
            '{"env": "reverse", "band": [0.1, 0.8], "samples": 4, "policy": "m", "tasks": [],'
            ' "extra": 1}',
            "not a task list: extra",
        ),
    ],
)
def test_load_refuses_malformed_files(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_task_list(path, _pool("reverse"))


def test_load_refuses_an_empty_list_and_foreign_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lists no tasks"):
        load_task_list(_save(tmp_path / "empty.json", ids=[]), _pool("reverse"))
    with pytest.raises(ValueError, match="not a train task"):
        load_task_list(_save(tmp_path / "h.json", ids=["reverse/heldout/3"]), _pool("reverse"))
    with pytest.raises(ValueError, match="not a reverse task id"):
        load_task_list(_save(tmp_path / "a.json", ids=["arith/train/3"]), _pool("reverse"))
    with pytest.raises(ValueError, match="cannot read it"):
        load_task_list(tmp_path / "missing.json", _pool("reverse"))


def test_pass_rates_on_the_tiny_model(lm: CausalLM) -> None:
    kw = {"samples": 4, "temperature": 1.0, "max_new_tokens": 8, "seed": 3}
    rates = pass_rates(lm, ENV, TASK_IDS, **kw)
    assert sorted(rates) == sorted(TASK_IDS)
    assert all(0.0 <= r <= 1.0 for r in rates.values())
    # Seeded per task, so neither a rerun nor a different batching moves a rate.
    assert pass_rates(lm, ENV, TASK_IDS, **kw, batch_prompts=3) == rates
    # Every completion reaches a threshold of 0.
    assert set(pass_rates(lm, ENV, TASK_IDS[:2], **kw, pass_threshold=0.0).values()) == {1.0}


class _ScriptedBackend:
    """Answers right on the first `right` samples of each group, wrong on the rest."""

    name, precision = "scripted", "fp32"

    def __init__(self, lm: CausalLM, right: int) -> None:
        self.lm, self.right = lm, right

    def generate_rows(self, lm, rows, *, max_new_tokens, temperature):
        out = []
        for row in rows:
            digits = self.lm.tokenizer.decode(row.context, skip_special_tokens=True)[4:-1]
            good = self.lm.tokenizer.encode(digits[::-1], add_special_tokens=False)
            bad = self.lm.tokenizer.encode("x", add_special_tokens=False)
            out.append(Generation(good if row.sample < self.right else bad, "eos", []))
        return out


def test_pass_rates_count_the_fraction_passed(lm: CausalLM) -> None:
    rates = pass_rates(
        lm,
        ENV,
        TASK_IDS,
        samples=4,
        temperature=1.0,
        max_new_tokens=8,
        seed=0,
        backend=_ScriptedBackend(lm, right=1),
    )
    assert rates == {t: 0.25 for t in TASK_IDS}


def test_cli_filter_tasks_writes_the_file(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tasks.json"
    argv = ["filter-tasks", "--model-dir", str(model_dir), "--tasks", "4", "--samples", "2"]
    main([*argv, "--band", "0", "1", "--out", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("scored 4 reverse tasks x 2 samples")
    doc = json.loads(out.read_text())
    assert doc["env"] == "reverse" and doc["samples"] == 2 and len(doc["tasks"]) == 4
    assert doc["policy"] == str(model_dir.resolve())
    assert load_task_list(out, _pool("reverse"))[1] == sorted(t["task_id"] for t in doc["tasks"])


@pytest.mark.parametrize(
    ("flag", "value", "names"),
    [
        ("--band", ["0.9", "0.1"], "--band"),
        ("--band", ["0.1", "2"], "--band"),
        ("--samples", ["0"], "--samples"),
        ("--env", ["nope"], "--env"),
    ],
)
def test_cli_filter_tasks_bad_flag_is_one_line(
    model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    value: list[str],
    names: str,
) -> None:
    argv = ["filter-tasks", "--model-dir", str(model_dir), "--out", str(tmp_path / "t.json")]
    with pytest.raises(SystemExit) as exc:
        main([*argv, flag, *value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names in err[0], err
    assert not (tmp_path / "t.json").exists()
