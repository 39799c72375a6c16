"""What runs inside one stack's process: a worker generating honest SmolLM2 groups and every
cheat the project catches, or a validator judging every worker's files.

    python -m bench.stacks.side worker CONFIG_JSON   (writes <out>/<stack>.jsonl)
    python -m bench.stacks.side judge CONFIG_JSON    (writes <out>/<stack>.verdicts.json)

The stack itself (interpreter, packages, kernel caps, threads) is the process it runs in;
CONFIG_JSON says only what the process cannot see of itself (engine, precision, attention).
"""

from __future__ import annotations

import copy
import json
import platform
import random
import sys
import time
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import torch

from bench.toploc.models import (
    MEASURED_WEIGHTS,
    WEIGHT_ATTACKS,
    Statistics,
    Validator,
    attack_entries,
    generate,
    new_lease,
    on_disk,
    specs,
    submission,
)
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.protocol.messages import SubmittedRollout

MAX_NEW_TOKENS = 48
ATTACKS = [*WEIGHT_ATTACKS, "older_policy_version", "sampling_ignores_seed", "wrong_temperature"]


def describe(cfg: dict) -> dict:
    """The stack as its process sees itself."""
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "kernel": torch.backends.cpu.get_cpu_capability().lower(),
        "device_class": device_class("cpu") + ("-eager" if cfg.get("attention") == "eager" else ""),
        "threads": torch.get_num_threads(),
        **{k: cfg[k] for k in ("engine", "precision") if k in cfg},
    }


def spec():
    (s,) = specs(["smollm2"], None)
    return replace(s, max_new_tokens=MAX_NEW_TOKENS)


def policy_of(lm: CausalLM) -> LoadedPolicy:
    return LoadedPolicy(10, "0a" * 32, lm)


def worker(cfg: dict) -> None:
    s, rng = spec(), random.Random(cfg["seed"])
    engine, precision = cfg["engine"], cfg["precision"]
    policy, declared = policy_of(s.lm), device_class("cpu")
    out = Path(cfg["out"]) / f"{cfg['stack']}.jsonl"
    started = time.monotonic()
    with out.open("w") as f:

        def put(kind: str, entry: SubmittedRollout) -> None:
            f.write(json.dumps({"kind": kind, "entry": entry.model_dump(mode="json")}) + "\n")

        made = 0
        while made < cfg["honest"]:
            batch = [new_lease(s, rng) for _ in range(min(4, cfg["honest"] - made))]
            for (lease, prompt), g in zip(
                batch, generate(s.lm, precision, batch, None, engine), strict=True
            ):
                put(
                    "honest",
                    submission(policy, lease, prompt, g, precision, declared, engine=engine),
                )
            made += len(batch)
        for name in ATTACKS:
            if name == "wrong_temperature":
                for _ in range(cfg["trials"]):
                    lease, prompt = new_lease(s, rng)
                    cold = lease.model_copy(
                        update={"sampling": lease.sampling.model_copy(update={"temperature": 0.6})}
                    )
                    (g,) = generate(s.lm, "bf16", [(cold, prompt)], None, engine)
                    put(name, submission(policy, lease, prompt, g, "bf16", declared, engine=engine))
                continue
            make = WEIGHT_ATTACKS.get(name) or MEASURED_WEIGHTS.get(name)
            cheat = make(s.lm) if make else None
            if cheat is not None and engine == "vllm":  # vLLM loads weights from a directory
                cheat = on_disk(cheat, f"stacks-{name}")
            for item in attack_entries(
                s, name, cheat, policy, rng, cfg["trials"], engine, declared
            ):
                assert not isinstance(item, tuple)
                put(name, item)
    print(json.dumps({"stack": describe(cfg), "seconds": round(time.monotonic() - started, 1)}))


def judge(cfg: dict) -> None:
    s = spec()
    lm = s.lm
    if cfg.get("attention") == "eager":
        module = copy.deepcopy(lm.module)
        module.set_attn_implementation("eager")
        lm = CausalLM(module, lm.tokenizer)
    me = describe(cfg)
    v = Validator(cfg["stack"], policy_of(lm), torch.get_num_threads(), me["device_class"])
    result: dict = {"stack": me, "workers": {}}
    for path in sorted(Path(cfg["entries"]).glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        honest = [
            SubmittedRollout.model_validate(r["entry"]) for r in rows if r["kind"] == "honest"
        ]
        outcomes: dict[str, int] = {}
        stats, why, held = Statistics(), [], []
        for at in range(0, len(honest), 4):
            chunk = honest[at : at + 4]
            for (final, j), e in zip(v.judge(chunk), chunk, strict=True):
                outcomes[final] = outcomes.get(final, 0) + 1
                if final == "held":
                    held.append(e.submission_id)
                stats.add(j)
                if final != "accept" and j.refusal is not None:
                    why.append(j.refusal.detail[:200])
        cheats: dict[str, dict[str, int]] = {}
        for r in rows:
            if r["kind"] == "honest":
                continue
            entry = SubmittedRollout.model_validate(r["entry"])
            ((final, _),) = v.judge([entry])
            c = cheats.setdefault(r["kind"], {"trials": 0, "caught": 0, "held": 0})
            c["trials"] += 1
            c["caught"] += final == "reject"
            c["held"] += final == "held"
            if final == "held":
                held.append(entry.submission_id)
        result["workers"][path.stem] = {
            "honest": {
                "groups": len(honest),
                "accepted": outcomes.get("accept", 0),
                "held": outcomes.get("held", 0),
                "slashed": outcomes.get("reject", 0),
                **stats.quantiles(),
                "refusals": why[:5],
            },
            "cheats": cheats,
            "held_ids": held,
        }
        print(f"  {cfg['stack']} judged {path.stem}: {outcomes} cheats {cheats}", flush=True)
    (Path(cfg["out"]) / f"{cfg['stack']}.verdicts.json").write_text(json.dumps(result, indent=1))


def settle(cfg: dict) -> None:
    """Work the validators held, judged as a pool settles it: by a validator of the class the
    worker declared (this process is the worker's own stack, so its class)."""
    me = describe(cfg)
    v = Validator(cfg["stack"], policy_of(spec().lm), torch.get_num_threads(), me["device_class"])
    wanted = set(cfg["ids"])
    rows = [json.loads(line) for line in Path(cfg["entries"]).read_text().splitlines()]
    finals = {}
    for r in rows:
        entry = SubmittedRollout.model_validate(r["entry"])
        if entry.submission_id in wanted:
            ((final, _),) = v.judge([entry])
            finals[entry.submission_id] = final
    Path(cfg["out"]).write_text(json.dumps({"stack": me, "finals": finals}))
    print(json.dumps({"settled": len(finals)}))


if __name__ == "__main__":
    {"worker": worker, "judge": judge, "settle": settle}[sys.argv[1]](json.loads(sys.argv[2]))
