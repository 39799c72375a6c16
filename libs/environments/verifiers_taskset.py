"""A `verifiers` taskset (its v1 API, `verifiers==0.4.0`, the `verifiers` extra) as an environment.

The pool names the taskset by its installed package (`PRIME_RECIPE_ENV=verifiers
PRIME_RECIPE_ENV_ARGS='{"taskset": "my_taskset"}'`), as `vf.load_taskset` finds it. Tasks are
the taskset's own rows in `load()` order, split into train and held-out by each task's content
key; the reward is the taskset's own `@vf.reward` functions (weighted as the taskset weights
them), run on a trace of the prompt and the one sampled reply, by the worker and again by the
validator.

Only what a validator can rerun is accepted, so a taskset is refused when the pool starts if it
needs a runtime (tools, a container, rewards that take `runtime`), a judge model, or the
network: its first task's reference reply is scored with every outbound connection refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import math
import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.protocol.messages import ChatMessage

HELDOUT_PERCENT = 10
MAX_TASKS = 100_000


class NeedsTheNetwork(RuntimeError):
    """A reward tried to open a network connection: a validator could not rerun it."""


@contextmanager
def no_network() -> Iterator[None]:
    """Every outbound connection refused while the block runs (this thread's and others')."""
    real_connect, real_create = socket.socket.connect, socket.create_connection

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NeedsTheNetwork("a reward opened a network connection")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.create_connection = real_create


class VerifiersTasksetEnv(Env):
    name = "verifiers"

    def __init__(
        self, taskset: str, config: dict[str, Any] | None = None, max_tasks: int = MAX_TASKS
    ) -> None:
        try:
            import verifiers.v1 as vf
            from verifiers.v1.configs.taskset import TasksetConfig
        except ImportError as exc:
            raise ImportError(
                "verifiers is not installed: pip install 'prime-swarm[verifiers]'"
            ) from exc
        self._vf = vf
        loaded = vf.load_taskset(TasksetConfig(id=taskset, **(config or {})))
        tasks = list(loaded.take(max_tasks) if loaded.INFINITE else loaded)
        if not tasks:
            raise ValueError(f"taskset {taskset!r} loaded no tasks")
        self.taskset = taskset
        self.max_answer_chars = 256
        self._splits: dict[str, list[Any]] = {"train": [], "heldout": []}
        for t in tasks:  # by content, so a task keeps its split whatever the load order
            digest = hashlib.sha256(t.key.encode()).digest()
            heldout = int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT
            self._splits["heldout" if heldout else "train"].append(t)
        if not self._splits["train"]:
            raise ValueError(f"taskset {taskset!r} has no train tasks")
        if not self._splits["heldout"]:  # a tiny taskset: evaluate on what it has
            self._splits["heldout"] = list(self._splits["train"])
        self._refuse_unrepeatable(tasks[0])

    def _refuse_unrepeatable(self, task: Any) -> None:
        """Refuse what a validator cannot rerun: judges, runtimes, containers, the network."""
        where = f"taskset {self.taskset!r}"
        if task.config.judges:
            raise ValueError(f"{where} scores with a judge model, which a validator cannot rerun")
        if task.NEEDS_CONTAINER or type(task).toolsets(task.config):
            raise ValueError(f"{where} needs tools or a container: not a single-turn taskset")
        for fn in task.hooks("reward"):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                raise ValueError(f"{where}: reward {fn.__name__!r} needs a runtime (sandbox)")
        reference = str(getattr(task.data, "answer", "") or "")
        try:
            with no_network():
                self._score(task, reference)
        except Exception as exc:  # verifiers wraps a reward's error in its own TaskError
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, NeedsTheNetwork):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
            raise ValueError(f"{where}: its reward needs the network ({cause})") from exc

    def _task(self, task_id: str) -> Any:
        split, index = self.parse_task_id(task_id)
        tasks = self._splits[split]
        return tasks[index % len(tasks)]

    def _messages(self, task: Any) -> list[ChatMessage]:
        """The task's prompt as chat messages (system prompt first, text contents only)."""
        from verifiers.v1.types import content_text

        data = task.data
        messages = []
        if data.system_prompt:
            messages.append(ChatMessage(role="system", content=data.system_prompt))
        if isinstance(data.prompt, str) or data.prompt is None:
            messages.append(ChatMessage(role="user", content=data.prompt or ""))
        else:
            messages += [
                ChatMessage(role=m.role, content=content_text(m.content))
                for m in data.prompt
                if m.role in ("system", "user", "assistant")
            ]
        return messages

    def task_from_id(self, task_id: str) -> Task:
        task = self._task(task_id)
        answer = str(getattr(task.data, "answer", "") or "")
        return Task(task_id=task_id, prompt=self._messages(task), answer=answer)

    def _score(self, task: Any, completion: str) -> float:
        """The taskset's rewards on a trace of the prompt and `completion`."""
        vf = self._vf
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        prompt = self._messages(task)
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=_vf_message(vf, m))
            for i, m in enumerate(prompt)
        ]
        nodes.append(
            MessageNode(
                parent=len(nodes) - 1,
                message=vf.AssistantMessage(content=completion),
                sampled=True,
            )
        )
        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key),
            agent=AgentInfo(config=vf.AgentConfig()),
            nodes=nodes,
            is_completed=True,
            ok=True,
        )
        asyncio.run(task.score(trace))
        value = trace.reward
        if not math.isfinite(value):
            raise ValueError(f"taskset {self.taskset!r} scored a non-finite reward")
        return float(value)

    def reward(self, task: Task, completion: str) -> float:
        return self._score(self._task(task.task_id), completion)

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        return task.answer


def _vf_message(vf: Any, m: ChatMessage) -> Any:
    kind = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    return kind[m.role](content=m.content)
