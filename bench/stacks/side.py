"""What runs inside one stack's process: a worker generating honest groups (SmolLM2 on
arithmetic; the tiny model warm-started on python-tool, multi-turn with real tool calls) and every
cheat the project catches, a validator judging every worker's files, or a validator of the
worker's own class settling what was held or audited.

    python -m bench.stacks.side worker CONFIG_JSON   (writes <out>/<stack>.jsonl)
    python -m bench.stacks.side judge CONFIG_JSON    (writes <out>/<stack>.verdicts.json)
    python -m bench.stacks.side settle CONFIG_JSON   (writes CONFIG_JSON's out)

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

from bench.toploc import multi_turn
from bench.toploc.models import (
    ENV,
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
from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.backend import make_backend
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import verify
from prime_swarm.libs.rollout.sampling_record import MARGINAL_Z
from prime_swarm.protocol.messages import SubmittedRollout

MAX_NEW_TOKENS = 48
ATTACKS = [*WEIGHT_ATTACKS, "older_policy_version", "sampling_ignores_seed", "wrong_temperature"]
# Multi-turn work: python-tool with SmolLM2 (real tool calls, run in the sandbox under the
# pool's tool_python; 48 tokens a turn, up to 4 turns, groups of 2) and the guess-number game
# with the tiny model warm-started on it (bench.toploc.multi_turn's policy and shapes), whose
# episodes cost milliseconds, so that the honest count is mostly multi-turn.
MULTI_TURN = {"python-tool": (2, 48), multi_turn.ENV_NAME: (multi_turn.GROUP, multi_turn.MAX_NEW)}
"""Environment -> (group size, new tokens per turn)."""
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "models"


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


def game_policy() -> LoadedPolicy:
    """The tiny model warm-started on the game; `bench.stacks` builds it once, before any stack
    runs, so that every stack loads the same weights."""
    return multi_turn.policy(CACHE)


def eager(lm: CausalLM) -> CausalLM:
    module = copy.deepcopy(lm.module)
    module.set_attn_implementation("eager")
    return CausalLM(module, lm.tokenizer)


def multi_turn_work(cfg: dict, rng: random.Random, smollm2: LoadedPolicy, put) -> None:
    """Honest multi-turn episodes on the stack's engine and precision (the worker's own path:
    libs/rollout/answer.start_leases), and forged environment replies among them."""
    serial = [cfg["seed"] * 10**6]
    for name, (group, max_new) in MULTI_TURN.items():
        p = smollm2 if name == "python-tool" else game_policy()
        if cfg["engine"] == "vllm" and p.lm.source is None:  # vLLM loads from a directory
            p = LoadedPolicy(p.version, p.model_hash, on_disk(p.lm, "stacks-smollm2"))
        # An engine per model: one holds one architecture's weights.
        backend = make_backend(cfg["engine"], cfg["precision"])
        env = load_env(name)
        wanted = cfg["multi_turn_groups"][name]

        def leases(n: int, env=env, group=group, max_new=max_new) -> list:
            out = []
            for _ in range(n):
                serial[0] += 1
                out.append(multi_turn.new_lease(env, rng, serial[0], max_new, group))
            return out

        made = 0
        while made < wanted:
            for e in multi_turn.answered(p, leases(min(16, wanted - made)), backend):
                put("honest", e)
                made += 1
        # SmolLM2's episodes cost seconds: one forged python-tool reply per stack.
        trials = 1 if name == "python-tool" else cfg["trials"]
        forged = tries = 0
        while forged < trials and tries < 20 * trials:
            tries += 1
            (e,) = multi_turn.answered(p, leases(1), backend)
            # A branch with a reply to forge: its first turn called the tool.
            for i, c in enumerate(e.submission.completions):
                if len(c.sampled_spans) > 1:
                    cheat = multi_turn.forged_tool_output(p, e, i, backend)
                    if cheat is not None:
                        put("forged_tool_output", multi_turn.submitted(p, e, i, cheat))
                        forged += 1
                        break


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
                # A 0.6 sample whose tokens are the 1.0 sample's, to the token, is the honest
                # group (SmolLM2 is peaked on arithmetic): nothing to catch, drawn again.
                made = tries = 0
                while made < cfg["trials"] and tries < 20 * cfg["trials"]:
                    tries += 1
                    lease, prompt = new_lease(s, rng)
                    cold = lease.model_copy(
                        update={"sampling": lease.sampling.model_copy(update={"temperature": 0.6})}
                    )
                    (g,) = generate(s.lm, "bf16", [(cold, prompt)], None, engine)
                    (h,) = generate(s.lm, "bf16", [(lease, prompt)], None, engine)
                    if [x.token_ids for x in g] == [x.token_ids for x in h]:
                        continue
                    put(name, submission(policy, lease, prompt, g, "bf16", declared, engine=engine))
                    made += 1
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
        multi_turn_work(cfg, rng, policy, put)
    print(json.dumps({"stack": describe(cfg), "seconds": round(time.monotonic() - started, 1)}))


def validators(cfg: dict) -> dict[str, Validator]:
    """This process's validator for each environment's policy, keyed by environment."""
    me = describe(cfg)
    smollm2 = policy_of(spec().lm)
    policies = {ENV.name: smollm2, "python-tool": smollm2, multi_turn.ENV_NAME: game_policy()}
    out = {}
    for env, p in policies.items():
        if cfg.get("attention") == "eager":
            p = LoadedPolicy(p.version, p.model_hash, eager(p.lm))
        out[env] = Validator(cfg["stack"], p, torch.get_num_threads(), me["device_class"])
    return out


def judge(cfg: dict) -> None:
    judges = validators(cfg)
    result: dict = {"stack": describe(cfg), "workers": {}}
    for path in sorted(Path(cfg["entries"]).glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        entries = [(r["kind"], SubmittedRollout.model_validate(r["entry"])) for r in rows]
        honest: dict[str, dict] = {}
        cheats: dict[str, dict[str, int]] = {}
        held, accepted_honest = [], []
        accepted_cheats: dict[str, float] = {}  # id -> its replay z (the sampling record's mark)
        for env, v in judges.items():
            mine = [e for kind, e in entries if kind == "honest" and e.lease.env == env]
            outcomes: dict[str, int] = {}
            stats, why, marked = Statistics(), [], 0
            for at in range(0, len(mine), 4):
                chunk = mine[at : at + 4]
                for (final, j), e in zip(v.judge(chunk), chunk, strict=True):
                    if final == "reject" and j.refusal and j.refusal.reason in verify.NOT_SLASHED:
                        final = j.refusal.reason  # refused, never slashed: not the worker's doing
                    outcomes[final] = outcomes.get(final, 0) + 1
                    if final == "held":
                        held.append(e.submission_id)
                    elif final == "accept":
                        accepted_honest.append(e.submission_id)
                        marked += bool(j.evidence and j.evidence.max_replay_z > MARGINAL_Z)
                    stats.add(j)
                    if final != "accept" and j.refusal is not None:
                        why.append(j.refusal.detail[:200])
            honest[env] = {
                "groups": len(mine),
                "accepted": outcomes.get("accept", 0),
                "held": outcomes.get("held", 0),
                "slashed": outcomes.get("reject", 0),
                "refused_not_slashed": {
                    k: n for k, n in outcomes.items() if k in verify.NOT_SLASHED
                },
                "marked": marked,
                **stats.quantiles(),
                "refusals": why[:5],
            }
        for kind, entry in entries:
            if kind == "honest":
                continue
            ((final, j),) = judges[entry.lease.env].judge([entry])
            c = cheats.setdefault(kind, {"trials": 0, "caught": 0, "held": 0})
            c["trials"] += 1
            c["caught"] += final == "reject"
            c["held"] += final == "held"
            if final == "held":
                held.append(entry.submission_id)
            elif final == "accept":
                z = j.evidence.max_replay_z if j.evidence else 0.0
                accepted_cheats[entry.submission_id] = z
        result["workers"][path.stem] = {
            "honest": honest,
            "cheats": cheats,
            "held_ids": held,
            "accepted_cheat_ids": accepted_cheats,
            "accepted_honest_ids": accepted_honest,
        }
        summary = {
            env: {k: h[k] for k in ("accepted", "held", "slashed")} for env, h in honest.items()
        }
        print(f"  {cfg['stack']} judged {path.stem}: {summary} cheats {cheats}", flush=True)
    (Path(cfg["out"]) / f"{cfg['stack']}.verdicts.json").write_text(json.dumps(result, indent=1))


def settle(cfg: dict) -> None:
    """Work judged again as a pool settles it: by a validator of the class the worker declared
    (this process is the worker's own stack, so its class). What cross-class validators held
    goes there by rule; what they accepted goes there by the audit draw (`audit_fraction`)."""
    judges = validators(cfg)
    wanted = set(cfg["ids"])
    rows = [json.loads(line) for line in Path(cfg["entries"]).read_text().splitlines()]
    finals = {}
    for r in rows:
        entry = SubmittedRollout.model_validate(r["entry"])
        if entry.submission_id in wanted:
            ((final, _),) = judges[entry.lease.env].judge([entry])
            finals[entry.submission_id] = final
    Path(cfg["out"]).write_text(json.dumps({"stack": describe(cfg), "finals": finals}))
    print(json.dumps({"settled": len(finals)}))


if __name__ == "__main__":
    {"worker": worker, "judge": judge, "settle": settle}[sys.argv[1]](json.loads(sys.argv[2]))
