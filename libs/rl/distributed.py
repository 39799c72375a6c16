"""Ranks for the training step (step.py) with FSDP2 (`fully_shard`): joining torchrun's group,
sharding the model, each rank's share of a step, the collectives the step's stats need, and full
checkpoints (the service loop lives elsewhere).

FSDP2 reduce-scatters *sums* of the gradients (each share's loss is already divided by the global
denominator), so the sharded gradient is exactly the single-process one, and clipping, AdamW and
the stats follow from it.

Outside torchrun every function degrades to the single-process behaviour, so one code path
serves both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map, tree_map_only

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import PromptCompletion
from prime_swarm.libs.model.io import once_per_tensor
from prime_swarm.libs.rl.grpo import Forward, Item, item_tokens
from prime_swarm.libs.rl.loss import SUMMED

T = TypeVar("T")

# The method FSDP treats as the root module's forward (see `shard_model`).
_ROOT_CALL = "prime_fsdp_call"


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    device: torch.device
    # False in a plain single process: nothing is initialised and every collective is skipped.
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = 600.0, init_method: str | None = None) -> DistContext:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) from its environment
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); without torchrun, a single-process
    context that initialises nothing."""
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistContext(0, 1, torch.device("cuda" if cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            # None: torchrun's env:// store. "file://..." rendezvous through a shared file
            # instead, with no TCP store listening anywhere (the test suite's way).
            init_method=init_method,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timedelta(seconds=timeout_s),
            # Binding the group to the device lets nccl connect eagerly (and avoids a warning).
            device_id=device if cuda else None,
        )
    return DistContext(dist.get_rank(), dist.get_world_size(), device, distributed=True)


def close_distributed(ctx: DistContext, finished: bool = False) -> None:
    """Leave the process group. `finished`: every rank ends its run normally, so they first
    meet at a barrier: a rank that destroys its group while a peer still talks to it leaves
    gloo's threads to abort the peer at exit ("terminate called without an active exception",
    one 2-rank CPU run in three). Never after a failure: the peers may be stuck in another
    collective, and the barrier would wait for them until the group's timeout."""
    if ctx.distributed and dist.is_initialized():
        try:
            if finished:
                dist.barrier()
        finally:
            dist.destroy_process_group()


def broadcast_batch(obj: T, ctx: DistContext) -> T:
    """Rank 0's `obj` (a picklable batch) on every rank; other ranks may pass None."""
    if not ctx.distributed:
        return obj
    box = [obj if ctx.is_main else None]
    # nccl moves the pickled bytes through a tensor on the rank's GPU; gloo through the CPU.
    dist.broadcast_object_list(box, src=0, device=ctx.device if ctx.device.type == "cuda" else None)
    return box[0]  # type: ignore[return-value]


def decoder_layers(module: nn.Module) -> nn.ModuleList:
    """The repeated transformer blocks of an HF causal LM (`model.model.layers` for Llama, Qwen,
    Mistral; `transformer.h` for GPT-2 style), each of which becomes one FSDP unit."""
    base = getattr(module, "base_model", module)
    n_layers = getattr(getattr(module, "config", None), "num_hidden_layers", None)
    for name in ("layers", "h", "blocks"):
        layers = getattr(base, name, None)
        if isinstance(layers, nn.ModuleList) and (n_layers is None or len(layers) == n_layers):
            return layers
    raise ValueError(f"cannot find the decoder layers of {type(module).__name__}")


def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


def shard_model(lm: CausalLM, ctx: DistContext, reshard_after_forward: bool = True) -> CausalLM:
    """Shard `lm` in place over all ranks (FSDP2): one unit per decoder layer, then the root
    (embeddings, final norm, head). A no-op in a single process. Returns `lm`.

    The optimizer must be built after this (it holds the sharded DTensor parameters).
    """
    if not ctx.distributed:
        return lm
    module = lm.module
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            # Sum, don't average, across ranks: every share's loss is already divided by the
            # whole step's denominator. Plain SUM also works on every backend (gloo has no
            # PREMUL_SUM).
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    # The trainer never calls module.forward: it runs the base model and applies the head's
    # weight itself (CausalLM.final_hidden / head_logits). FSDP gathers the root's parameters
    # only around a forward, so give the root one that runs any callable inside it.
    setattr(module, _ROOT_CALL, _call)
    register_fsdp_forward_method(module, _ROOT_CALL)
    return lm


def is_sharded(lm: CausalLM) -> bool:
    return isinstance(lm.module, FSDPModule)


def sharded_forward(forward: Forward) -> Forward:
    """`forward` run inside the FSDP root's forward when the model is sharded (unchanged when
    not), so the root's parameters are gathered for it and its gradients reduced after."""

    def run(lm: CausalLM, pairs: Sequence[PromptCompletion]) -> Any:
        if not is_sharded(lm):
            return forward(lm, pairs)
        # CausalLM caches an fp32 copy of a low-precision head keyed by storage pointer and
        # version; FSDP refills the same gathered storage every forward, so never trust it.
        lm._head_fp32 = None
        return getattr(lm.module, _ROOT_CALL)(forward, lm, pairs)

    return run


def rank_share(items: Sequence[Item], rank: int, world_size: int) -> list[Item]:
    """This rank's items: longest first to the least-loaded rank (by tokens), ties to the lower
    rank. Deterministic, so every rank computes the same split from the same plan."""
    load = [0] * world_size
    mine: list[Item] = []
    for i in sorted(range(len(items)), key=lambda i: -item_tokens(items[i])):
        r = min(range(world_size), key=lambda r: load[r])
        load[r] += item_tokens(items[i])
        if r == rank:
            mine.append(items[i])
    return mine


_EXTREMES = (("ratio_min", -1.0), ("ratio_max", 1.0), ("is_weight_max", 1.0))


def all_reduce_stats(parts: list[dict[str, float]], ctx: DistContext) -> list[dict[str, float]]:
    """This rank's micro-batch stats -> one part holding the whole step's sums and extremes."""
    if not ctx.distributed:
        return parts
    sums = torch.tensor(
        [sum(p[k] for p in parts) for k in SUMMED], dtype=torch.float64, device=ctx.device
    )
    # Extremes as a MAX (a min is the max of the negation); a rank without parts offers -inf.
    extremes = torch.tensor(
        [max((sign * p[k] for p in parts), default=-float("inf")) for k, sign in _EXTREMES],
        dtype=torch.float64,
        device=ctx.device,
    )
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    merged = dict(zip(SUMMED, sums.tolist(), strict=True))
    for (k, sign), v in zip(_EXTREMES, extremes.tolist(), strict=True):
        merged[k] = sign * v
    return [merged]


def max_over_ranks(n: int, ctx: DistContext) -> int:
    if not ctx.distributed:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# ------------------------------------------------------------------ checkpoints
#
# Full (unsharded) state dicts in the single-process format: what `save_pretrained` and a
# single-GPU resume expect. Gathering is a collective: call these on every rank.


def _full() -> StateDictOptions:
    # cpu_offload with full_state_dict gathers onto rank 0 only (the others get {}): a full
    # copy of a large model per rank would not fit in host memory.
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _load(ctx: DistContext) -> StateDictOptions:
    # Rank 0 alone reads the checkpoint; the others receive their shards from it.
    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=ctx.distributed)


def _for_loading(state: dict[str, Any] | None, lm: CausalLM, ctx: DistContext) -> dict[str, Any]:
    """`state` as the setters may consume it without touching the caller's checkpoint."""
    if not state:
        return {}
    device = lm.device

    def own(x: Any) -> Any:
        # Loading keeps a tensor as given when it needs no copy (already on the device, no
        # shards to cut from it; AdamW's scalar `step` always), and the optimizer then updates
        # it in place: those are cloned.
        if isinstance(x, torch.Tensor) and (
            x.dim() == 0 or (not ctx.distributed and x.device == device)
        ):
            return x.clone()
        return x

    # Fresh containers too: the setters rewrite the dict they are given (rank 0's entries
    # become this rank's shards).
    return tree_map(own, state)


def _unshared(state: dict[str, Any], live: list[torch.Tensor]) -> dict[str, Any]:
    # A gathered or offloaded tensor is new memory, but a CPU tensor that needed neither (every
    # tensor of an unsharded CPU model, AdamW's scalar `step` under FSDP) comes back as the live
    # one: a checkpoint held in memory would then keep moving with training. Copy those.
    # One copy per tensor, not per name: tied weights (a head that is the embedding) stay tied,
    # or a published version would carry the embedding twice.
    ptrs = {t.untyped_storage().data_ptr() for t in live}
    clone = once_per_tensor(torch.Tensor.clone)

    def copy(t: torch.Tensor) -> torch.Tensor:
        return clone(t) if t.untyped_storage().data_ptr() in ptrs else t

    return tree_map_only(torch.Tensor, copy, state)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def full_state_dict(lm: CausalLM, ctx: DistContext) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on CPU on rank 0 (None on the other ranks), sharing no memory
    with the live model."""
    sd = get_model_state_dict(lm.module, options=_full())
    if not ctx.is_main:
        return None
    return _unshared(sd, [_local(t) for t in lm.module.state_dict().values()])


def full_optimizer_state_dict(
    lm: CausalLM, optimizer: torch.optim.Optimizer, ctx: DistContext
) -> dict[str, Any] | None:
    """The optimizer's whole state (keyed by parameter name) on CPU on rank 0 (None
    elsewhere), sharing no memory with the live optimizer."""
    sd = get_optimizer_state_dict(lm.module, optimizer, options=_full())
    if not ctx.is_main:
        return None
    live = [_local(t) for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
    return _unshared(sd, live)


def load_full_optimizer_state_dict(
    lm: CausalLM, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None, ctx: DistContext
) -> None:
    """Load `full_optimizer_state_dict`'s output (held by rank 0) into the optimizer."""
    set_optimizer_state_dict(lm.module, optimizer, _for_loading(state, lm, ctx), options=_load(ctx))
