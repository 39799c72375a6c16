"""The FSDP2 GRPO step on two CPU ranks (gloo, torchrun) equals the single-process step: same
gradients, same weights after three AdamW steps, with gradient accumulation, uneven micro-batch
counts per rank (a zero-loss filler keeps FSDP's collectives in step) and packing; full state
dicts resume exactly. The ranks run in a child torchrun (fsdp_probe.py); a process group
cannot be set up and torn down inside pytest's own process reliably."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from script_files import load_script
from torch.utils._pytree import tree_leaves, tree_map_only

from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl.distributed import (
    DistContext,
    full_optimizer_state_dict,
    full_state_dict,
    init_distributed,
    load_full_optimizer_state_dict,
    rank_share,
    shard_model,
)
from prime_swarm.libs.rl.grpo import (
    GRPOConfig,
    Rollout,
    item_tokens,
    make_optimizer,
    plan_step,
)
from prime_swarm.libs.rl.step import train_step

PROBE = Path(__file__).with_name("fsdp_probe.py")


def _loopback() -> str:
    """The loopback interface's name, so gloo binds 127.0.0.1 and nothing else."""
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    return names[0] if names else "lo"


def _private_network(cmd: list[str]) -> list[str]:
    """`cmd` in a network namespace of its own with only loopback up, where one is available.

    torchrun's agent store (a TCPStore) listens on every interface whatever --master-addr says
    (torch 2.13 has no bind-address option; pytorch/pytorch#173909). In a private namespace
    every interface is loopback. gloo's own sockets follow GLOO_SOCKET_IFNAME either way.
    """
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare and ip:
        check = subprocess.run([unshare, "-rn", ip, "link", "set", "lo", "up"], capture_output=True)
        if check.returncode == 0:
            return [unshare, "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh", *cmd]
    # Tests bind only to 127.0.0.1: without a private namespace torchrun would listen on all.
    pytest.skip("needs `unshare -rn` and `ip` to keep torchrun's store off public interfaces")


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    # One thread per rank: two ranks on two cores. No leftovers of an outer torchrun.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=_loopback())
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
        *("--master-addr", "127.0.0.1", "--master-port", str(free_port())),
        *("--local-addr", "127.0.0.1", str(PROBE)),
    ]
    done = subprocess.run(
        _private_network(cmd), capture_output=True, text=True, timeout=150, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", ["padded", "packed", "shared_prompt"])
def test_two_ranks_train_as_one_process(probe: dict[str, Any], variant: str) -> None:
    r = probe[variant]
    # The comparison is not vacuous: the ranks needed different numbers of micro-batches (the
    # filler ran), accumulated more than one, the weights moved and PPO clipping took part.
    assert r["micro_batches_per_rank"][0] != r["micro_batches_per_rank"][1]
    assert r["rounds"] == max(r["micro_batches_per_rank"]) >= 2
    assert r["weights_moved"] > 1e-3 and r["clip_frac"] > 0.1
    assert r["grads_diff"] < 1e-6
    assert r["weights_diff"] < 1e-5
    assert r["optim_diff"] < 1e-6 and r["optim_step"] == 3.0
    assert r["stats_diff"] < 1e-5
    # Resumed from the full state dicts, a fresh sharded model steps exactly as the original;
    # taking and loading the checkpoint left it as it was.
    assert r["resume_diff"] == 0.0 and r["resume_moved"] > 1e-4
    assert r["checkpoint_changed"] == 0.0
    if variant == "packed":
        assert r["rows_saved"] >= 1


# ---------------------------------------------------------------- one process, no torchrun


def _batch() -> list[list[Rollout]]:
    """The probe's batch (the probe is a script, not a module of the package)."""
    return load_script(PROBE, "fsdp_probe").make_batch()


def _lm() -> CausalLM:
    return CausalLM(init_tiny_model(0), build_tokenizer())


def test_outside_torchrun_everything_is_the_single_process_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    ctx = init_distributed()
    assert not ctx.distributed and ctx.is_main and ctx.world_size == 1
    batch, cfg = _batch(), GRPOConfig(micro_batch_tokens=40)
    a, b = _lm(), shard_model(_lm(), ctx)
    sa = train_step(a, make_optimizer(a, lr=1e-3), batch, cfg)
    sb = train_step(b, make_optimizer(b, lr=1e-3), batch, cfg, ctx)
    assert sb["micro_batches"] >= 2
    assert sa == sb
    for x, y in zip(a.module.parameters(), b.module.parameters(), strict=True):
        assert torch.equal(x, y)


def test_single_process_checkpoints_round_trip_without_aliasing() -> None:
    ctx = DistContext(0, 1, torch.device("cpu"))
    batch = _batch()
    lm = _lm()
    opt = make_optimizer(lm, lr=1e-3)
    train_step(lm, opt, batch, None, ctx)
    weights, optim = full_state_dict(lm, ctx), full_optimizer_state_dict(lm, opt, ctx)
    assert weights is not None and optim is not None
    snapshot = tree_map_only(torch.Tensor, torch.clone, (weights, optim))

    other = _lm()
    other.module.load_state_dict(weights)  # as the trainer resumes: the weights come first
    other_opt = make_optimizer(other, lr=1e-3)
    load_full_optimizer_state_dict(other, other_opt, optim, ctx)
    train_step(lm, opt, batch, None, ctx)
    train_step(other, other_opt, batch, None, ctx)
    for x, y in zip(lm.module.parameters(), other.module.parameters(), strict=True):
        assert torch.equal(x, y)
    # Neither training the source nor training what was loaded from it moved the checkpoint.
    now, then = tree_leaves((weights, optim)), tree_leaves(snapshot)
    assert len(now) == len(then)
    assert all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        for a, b in zip(now, then, strict=True)
    )
    assert float(optim["state"]["lm_head.weight"]["step"]) == 1.0


def test_rank_shares_split_every_item_once_and_balance_tokens() -> None:
    items = plan_step(_batch(), GRPOConfig()).items
    shares = [rank_share(items, r, 3) for r in range(3)]
    assert sorted(id(i) for s in shares for i in s) == sorted(id(i) for i in items)
    tokens = [sum(map(item_tokens, s)) for s in shares]
    assert max(tokens) - min(tokens) <= max(map(item_tokens, items))
