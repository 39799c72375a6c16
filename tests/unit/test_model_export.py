"""`prime-swarm export` (deploy/local/export.py, libs/model/export.py): a trainer version written
as a Hugging Face directory that plain transformers loads and that generates as the checkpoint
did; the check catches a wrong export; bad flags are one line naming the flag."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from prime_swarm.deploy.local.cli import main
from prime_swarm.libs.model.backend import make_backend
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.export import ExportCheck, check_export, export_model
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rl import checkpoint as ckpt

# ChatML, SmolLM2's kind of template: the tiny tokenizer has none of its own.
TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)
PROMPT = "rev 4821="
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture(autouse=True)
def no_prime_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """--heldout reads the recipe from PRIME_* variables: none of the machine's leak in."""
    for var in list(os.environ):
        if var.startswith("PRIME_"):
            monkeypatch.delenv(var)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions 0 and 1 as the trainer saves them: v1's weights a snapshot that moved."""
    root = tmp_path_factory.mktemp("run") / "checkpoints"
    module, tok = init_tiny_model(3), build_tokenizer()
    tok.chat_template = TEMPLATE
    ckpt.save_checkpoint(root, module, tok, ckpt.TrainerState(step=0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        moved = {
            k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
            for k, v in module.state_dict().items()
        }
    ckpt.save_checkpoint(root, module, tok, ckpt.TrainerState(step=1), moved)
    return root


def export(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    main(["export", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    return out[0]


def pool_greedy(model_dir: Path, ids: list[int], n: int) -> list[int]:
    """The checkpoint as the pool generates from it: the project's loader, the hf backend at
    temperature 0."""
    lm = load_pretrained(model_dir)
    backend = make_backend("hf", precision="fp32")
    (group,) = backend.generate(lm, [ids], [0], group_size=1, max_new_tokens=n, temperature=0.0)
    return group[0].token_ids


def test_export_loads_in_plain_transformers_and_generates_as_the_checkpoint(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    line = export(["--checkpoints", str(checkpoints), "--out", str(out), "--heldout", "2"], capsys)
    # The newest version by default; the check passed and said so.
    assert line.startswith(f"exported {ckpt.model_dir(checkpoints, 1)} (fp32) to {out}")
    assert "greedy 16 tokens as the checkpoint" in line and "chat template kept" in line
    assert "held-out reward" in line and "on 2 tasks" in line
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }
    # What a user's tools do, and nothing of ours.
    module = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert module.dtype == torch.float32
    # The chat template came along, in the new file and in tokenizer_config.json for tools
    # that read only that.
    assert tok.chat_template == TEMPLATE
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]
    source = ckpt.model_dir(checkpoints, 1)
    assert ids == prompt_ids(load_pretrained(source).tokenizer, PROMPT)
    with torch.no_grad():
        generated = module.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)
    tokens = generated[0, len(ids) :].tolist()
    assert len(tokens) >= 4
    assert tokens == pool_greedy(source, ids, 12)
    # And not v0's: the version asked for is the one written.
    assert tokens != pool_greedy(ckpt.model_dir(checkpoints, 0), ids, 12)


def test_bf16_export_of_an_older_version(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    argv = ["--checkpoints", str(checkpoints), "--version", "0", "--out", str(out)]
    line = export([*argv, "--dtype", "bf16"], capsys)
    assert line.startswith(f"exported {ckpt.model_dir(checkpoints, 0)} (bf16)")
    module = AutoModelForCausalLM.from_pretrained(out)
    assert module.dtype == torch.bfloat16
    master = load_file(ckpt.model_dir(checkpoints, 0) / "model.safetensors")
    shipped = load_file(out / "model.safetensors")
    assert shipped.keys() == master.keys()
    assert all(torch.equal(shipped[k], t.to(torch.bfloat16)) for k, t in master.items())
    # --force replaces the directory whole: fp32 now, no bf16 file left behind.
    export([*argv, "--force"], capsys)
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.float32


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        ("weight", "logit diff"),
        ("rounded", "logit diff"),
        ("version", "greedy tokens differ"),
        ("template", "chat template differs"),
    ],
)
def test_the_check_catches_a_wrong_export(
    checkpoints: Path, tmp_path: Path, corrupt: str, problem: str
) -> None:
    source = ckpt.model_dir(checkpoints, 1)
    out = export_model(source, tmp_path / "export", torch.float32)
    assert check_export(source, out, torch.float32).ok
    if corrupt == "weight":
        # One weight moved by a thousandth of its matrix's largest: greedy tokens unchanged.
        weights = load_file(out / "model.safetensors")
        w = weights["model.layers.0.mlp.down_proj.weight"]
        w[0, 0] += 1e-3 * w.abs().max()
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    elif corrupt == "rounded":
        # fp32 asked, bf16 values written: greedy tokens unchanged, logits 0.02 apart.
        weights = {
            k: t.to(torch.bfloat16).float() for k, t in load_file(out / "model.safetensors").items()
        }
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    elif corrupt == "version":
        export_model(ckpt.model_dir(checkpoints, 0), out, torch.float32, force=True)
    else:
        (out / "chat_template.jinja").write_text(TEMPLATE.replace("assistant", "bot"))
    check = check_export(source, out, torch.float32)
    assert not check.ok
    assert any(problem in p for p in check.problems()), check.problems()


def test_agreement_stops_at_the_first_near_tie() -> None:
    check = ExportCheck(
        dtype=torch.float32,
        expected_dtype=torch.float32,
        same_prompt_ids=True,
        same_chat_template=True,
        has_chat_template=False,
        tokens=(5, 6, 7),
        reference_tokens=(5, 6, 7),
        reference_gaps=(1.0, 1e-4, 1.0),
        prompt_ids=(1,),
        max_logit_diff=0.0,
    )
    assert check.agrees_with([5, 6, 7], near_tie=1e-3)
    assert check.agrees_with([5, 9, 9], near_tie=1e-3)  # position 1 is a tie: either is honest
    assert not check.agrees_with([4, 6, 7], near_tie=1e-3)
    assert not check.agrees_with([5], near_tie=1e-5)
    assert not check.agrees_with([5, 9, 7], near_tie=1e-5)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--checkpoints", "{tmp}/nowhere"], "--checkpoints"),
        (["--checkpoints", "{tmp}/empty"], "--checkpoints"),
        (["--version", "7"], "--version"),
        (["--out", "{tmp}/full"], "--out"),
        (["--out", "{tmp}/full", "--force"], "--out"),  # not a model directory: kept
        (["--out", "{tmp}/file"], "--out"),
        (["--out", "{ckpt}/v1"], "--out"),
        (["--dtype", "fp16"], "--dtype"),
        (["--heldout", "0"], "--heldout"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(
    checkpoints: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    flag: str,
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    given = [a.format(tmp=tmp_path, ckpt=checkpoints) for a in argv]
    defaults = ["--checkpoints", str(checkpoints), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        main(["export", *defaults, *given])  # argparse: the last of a flag given wins
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prime-swarm export: ") and flag in err[0], err
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    assert ckpt.saved_versions(checkpoints) == [0, 1]
