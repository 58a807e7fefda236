"""`verifiers`: environments written for the `verifiers` library (v1, 0.4.x) played by name.

The spec names a verifiers taskset (and optionally the multi-turn env that plays it):

    environment:
      name: verifiers
      options:
        taskset: my_tasks               # a verifiers taskset id (an installed package), or module:Class
        tasksetConfig: {difficulty: 3}  # the taskset's own config fields
        env: ""                         # a verifiers env id or module:Class; empty: the taskset's own, else
                                        # single-turn (the model's first reply is scored)

Each data record names its task with its reference answer (the task's idx, id, name or key), so the
prompt the model sees is the record's; `python -m decentralized_verl.environments.verifiers_env` writes
a data file from a taskset (each task's system prompt and prompt, and its name as the answer). The env's
messages are the observations (user messages) and the task's rewards score the episode
(`verifiers_play.py`). The package is optional (`pip install 'decentralized-verl[verifiers]'`): the
options are checked without it, and a worker without it fails naming `data.environment.name`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import ValidationError

from decentralized_verl.environments.base import EpisodeRecord, StepInfo, StepResult
from decentralized_verl.spec.catalogue.environments import VerifiersOptions

INSTALL_HINT = "pip install 'decentralized-verl[verifiers]' (or pip install verifiers)"


class VerifiersUnavailable(ValueError):
    """The `verifiers` package is not installed where an episode is to be played."""


def require_verifiers() -> Any:
    """`verifiers.v1`, or VerifiersUnavailable naming the field that asked for it."""
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError as exc:
        raise VerifiersUnavailable(
            f"data.environment.name: 'verifiers' needs the verifiers package, which is not installed "
            f"here ({exc}); {INSTALL_HINT}"
        ) from None


def _import_class(path: str, field: str) -> type:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"{field}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, attribute, None)
    if not isinstance(cls, type):
        raise ValueError(f"{field}: {module_name} has no class {attribute}")
    return cls


def taskset_class(name: str) -> type:
    vf = require_verifiers()
    field = "data.environment.options.taskset"
    if ":" in name:
        cls = _import_class(name, field)
    else:
        from verifiers.v1.utils.loaders import taskset_class as by_id  # noqa: PLC0415 optional: verifiers (the verifiers extra); options are checked without it

        try:
            cls = by_id(name)
        except Exception as exc:
            raise ValueError(f"{field}: {exc}") from None
    if not issubclass(cls, vf.Taskset):
        raise ValueError(f"{field}: {name} is not a verifiers Taskset")
    return cls


def env_class(options: VerifiersOptions) -> type:
    """The env that plays the tasks: the named one, else the one the taskset's module exports (verifiers'
    own convention), else single-turn."""
    vf = require_verifiers()
    from verifiers.v1.utils.loaders import environment_class  # noqa: PLC0415 optional: verifiers (the verifiers extra); options are checked without it

    from decentralized_verl.environments.verifiers_play import SingleTurn  # noqa: PLC0415 optional: verifiers_play imports verifiers (the verifiers extra)

    field = "data.environment.options.env"
    if ":" in options.env:
        cls = _import_class(options.env, field)
    else:
        try:
            if options.env or ":" not in options.taskset:
                cls = environment_class("" if ":" in options.taskset else options.taskset, options.env)
            else:
                cls = _exported_env(importlib.import_module(options.taskset.partition(":")[0]))
        except Exception as exc:
            raise ValueError(f"{field}: {type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, vf.Env)):
        raise ValueError(f"{field}: {options.env} is not a verifiers Env")
    return SingleTurn if cls is vf.SingleAgentEnv else cls


def _exported_env(module: Any) -> type:
    """The Env subclass a taskset's module exports in `__all__` (verifiers' convention), else single-turn."""
    vf = require_verifiers()
    from verifiers.v1.utils.loaders import _plugin_class  # noqa: PLC0415 optional: verifiers (the verifiers extra); options are checked without it

    try:
        return _plugin_class(module, vf.Env, "environment")
    except (TypeError, AttributeError):  # the module exports no Env
        return vf.SingleAgentEnv


def _config(cls: type, base: type, origin: type, values: Mapping[str, Any], field: str) -> Any:
    from verifiers.v1.utils.generic import concrete_type  # noqa: PLC0415 optional: verifiers (the verifiers extra); options are checked without it

    config_cls = concrete_type(cls, base, origin=origin) or base
    try:
        return config_cls.model_validate(dict(values))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join([field, *(str(part) for part in error["loc"])])
        raise ValueError(f"{where}: {error['msg']}") from None
    except Exception as exc:
        raise ValueError(f"{field}: {type(exc).__name__}: {exc}") from None


class TaskIndex:
    """A taskset's tasks by every name a record may give them: idx, id, name and key."""

    def __init__(self, tasks: Sequence[Any]) -> None:
        self.tasks = list(tasks)
        self.by_name: dict[str, Any] = {}
        for task in self.tasks:
            for name in (task.key, task.data.name, task.data.id, task.data.idx):
                if name is not None:
                    self.by_name.setdefault(str(name), task)

    def find(self, name: str) -> Any:
        task = self.by_name.get(name.strip())
        if task is None:
            raise ValueError(
                f"the record's reference answer {name!r:.60} names no task of the taskset "
                f"(by idx, id, name or key; {len(self.tasks)} tasks indexed)"
            )
        return task


@functools.lru_cache(maxsize=8)
def _index(taskset: str, config_json: str, max_tasks: int) -> TaskIndex:
    vf = require_verifiers()
    cls = taskset_class(taskset)
    config = _config(
        cls, vf.TasksetConfig, vf.Taskset, json.loads(config_json), "data.environment.options.tasksetConfig"
    )
    return TaskIndex(list(itertools.islice(iter(cls(config)), max_tasks)))


def task_index(options: VerifiersOptions) -> TaskIndex:
    return _index(options.taskset, json.dumps(options.taskset_config, sort_keys=True), options.max_tasks)


@functools.lru_cache(maxsize=8)
def _env(env: str, taskset: str, config_json: str) -> Any:
    """The env instance whose `run` plays episodes. Built without its constructor, which would load
    harnesses and runtimes that are not used here; its config holds the env's own fields."""
    vf = require_verifiers()
    options = VerifiersOptions(taskset=taskset, env=env)
    cls = env_class(options)
    instance = cls.__new__(cls)
    instance.config = _config(
        cls, vf.EnvConfig, vf.Env, json.loads(config_json), "data.environment.options.envConfig"
    )
    return instance


class VerifiersEnvironment:
    """A verifiers taskset's task, played turn by turn (see the module docstring)."""

    Options = VerifiersOptions
    instructions: ClassVar[str] = ""
    """None of its own: the task's system prompt comes with the record (the exported data file)."""

    def __init__(self, options: VerifiersOptions | None = None) -> None:
        if options is None:
            raise ValueError("data.environment.options.taskset: the verifiers environment needs a taskset")
        self.options = options
        self.preflight(options)
        self.play: Any = None

    @classmethod
    def preflight(cls, options: VerifiersOptions) -> None:
        """Fail before any episode: the package, the taskset, the env and their configs."""
        require_verifiers()
        task_index(options)
        _env(options.env, options.taskset, json.dumps(options.env_config, sort_keys=True))

    def reset(self, record: EpisodeRecord) -> None:
        from decentralized_verl.environments.verifiers_play import EpisodePlay  # noqa: PLC0415 optional: verifiers_play imports verifiers (the verifiers extra)

        task = task_index(self.options).find(record.ground_truth)
        if task.data.prompt is None:
            raise ValueError(
                f"task {record.ground_truth!r}: it has no prompt (the user opens it); unsupported"
            )
        env = _env(
            self.options.env, self.options.taskset, json.dumps(self.options.env_config, sort_keys=True)
        )
        self.play = EpisodePlay(env, task, env_id=self.options.env or self.options.taskset)
        weakref.finalize(self, self.play.cancel)  # an episode cut short by a limit stops its env too

    def step(self, turn: str) -> StepResult:
        from decentralized_verl.environments.verifiers_play import Failed, Finished  # noqa: PLC0415 optional: verifiers_play imports verifiers (the verifiers extra)

        assert self.play is not None, "reset before step"
        event = self.play.reply(turn, self.options.reply_timeout_s)
        if isinstance(event, Failed):
            raise RuntimeError(event.message)
        if isinstance(event, Finished):
            return StepResult(None, event.reward, done=True, info=StepInfo(reason=event.reason))
        return StepResult(event.text, role="user")


def task_records(options: VerifiersOptions, limit: int | None = None, system: bool = True) -> list[dict]:
    """Data records for a taskset's tasks: the task's system prompt and prompt, its name as the answer."""
    records = []
    index = task_index(options)
    for task in index.tasks[:limit]:
        data = task.data
        if data.prompt is None:
            continue
        messages = (
            [{"role": "system", "content": data.system_prompt}] if system and data.system_prompt else []
        )
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages.extend(
                m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in data.prompt
            )
        # The first of its names that finds this very task again (names need not be unique; keys are).
        names = (data.name, data.id, str(data.idx), task.key)
        answer = next(n for n in names if n is not None and index.by_name.get(str(n)) is task)
        records.append({"messages": messages, "gt_answer": answer})
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a data file (jsonl) from a verifiers taskset")
    parser.add_argument("taskset", help="a verifiers taskset id, or module:Class")
    parser.add_argument("output")
    parser.add_argument("--config", default="{}", help="the taskset's config as JSON")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--no-system", action="store_true", help="leave the tasks' system prompts out")
    args = parser.parse_args(argv)
    options = VerifiersOptions(taskset=args.taskset, taskset_config=json.loads(args.config))
    records = task_records(options, args.limit, system=not args.no_system)
    with open(args.output, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    print(f"{len(records)} records -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
