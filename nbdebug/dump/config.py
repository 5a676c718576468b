"""msProbe ``config.json`` for nbdebug's dump writer: parse, validate, and the same filters.

A config is a path to msProbe's ``config.json``, a dict with the same keys, or None (msProbe's
defaults: task ``statistics``, level ``L1``). Keyword overrides win over the file, as in msProbe's
``PrecisionDebugger(config_path, task=, dump_path=, level=, step=)``.

Supported keys: ``task`` (statistics | tensor), ``dump_path``, ``rank`` and ``step`` (lists of ints or
``"4-6"`` ranges), ``level`` (L0 | L1 | mix | debug), ``extra_info`` (write stack.json and
construct.json), ``async_dump`` (accepted; nbdebug always writes asynchronously), ``precision``,
``risk_level`` (FOCUS | CORE | ALL), and in the task block ``scope``, ``list``, ``data_mode``,
``summary_mode`` (statistics | md5). Anything else msProbe reads (``acc_check``, ``load`` ...) is
ignored; an unsupported task or level is an error naming it.

>>> cfg = DumpConfig.load({"task": "tensor", "level": "mix", "step": ["0-2", 5],
...                        "tensor": {"list": ["fc1"], "data_mode": ["forward"]}})
>>> cfg.step, cfg.task, cfg.list
([0, 1, 2, 5], 'tensor', ['fc1'])
>>> cfg.allowed("forward", "output"), cfg.allowed("backward", "input")
(True, False)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

TASKS = ("statistics", "tensor")
LEVELS = ("L0", "L1", "mix", "debug")
DATA_MODES = ("all", "forward", "backward", "input", "output")
SUMMARY_MODES = ("statistics", "md5")
RISK_LEVELS = ("FOCUS", "CORE", "ALL")
PRECISIONS = ("low", "high")
_MSPROBE_TASKS = ("overflow_check", "acc_check", "structure", "diff_check", "nan_check", "free_benchmark",
                  "run_ut", "grad_probe", "exception_dump")
_STEP_MAX = 1_000_000


class ConfigError(ValueError):
    """A config value nbdebug cannot use; the message names the key, the value and what is allowed."""


def _steps_or_ranks(value: Any, key: str, source: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{source}: {key!r} must be a list of ints or 'a-b' ranges, got {value!r}")
    out: set[int] = set()
    for item in value:
        if isinstance(item, bool):
            raise ConfigError(f"{source}: {key!r} elements must be ints or 'a-b' strings, got {item!r}")
        if isinstance(item, int):
            if not 0 <= item <= _STEP_MAX:
                raise ConfigError(f"{source}: {key!r} element {item} is outside 0..{_STEP_MAX}")
            out.add(item)
            continue
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", item) if isinstance(item, str) else None
        if m is None:
            raise ConfigError(f"{source}: {key!r} element {item!r} is neither an int nor an 'a-b' range")
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi or hi > _STEP_MAX:
            raise ConfigError(f"{source}: {key!r} range {item!r} must have start <= end <= {_STEP_MAX}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _str_list(value: Any, key: str, source: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {key!r} must be a list of strings, got {value!r}")
    return list(value)


@dataclass
class DumpConfig:
    """A validated msProbe dump configuration (see the module docstring for the keys)."""

    task: str = "statistics"
    dump_path: str | None = None
    level: str = "L1"
    step: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    extra_info: bool = True
    async_dump: bool = False
    precision: str = "low"
    risk_level: str = "FOCUS"
    scope: list[str] = field(default_factory=list)
    list: list[str] = field(default_factory=list)
    data_mode: list[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    source: str = "config"

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def load(cls, config: Any = None, *, task: str | None = None, dump_path: str | None = None,
             level: str | None = None, step: Any = None) -> DumpConfig:
        """Parse ``config`` (path, dict, DumpConfig or None) and apply the keyword overrides."""
        if isinstance(config, DumpConfig):
            raw: dict[str, Any] = config.to_dict()
            source = config.source
        elif config is None:
            raw, source = {}, "config"
        elif isinstance(config, dict):
            raw, source = dict(config), "config"
        elif isinstance(config, (str, os.PathLike)):
            source = os.fspath(config)
            try:
                with open(source, encoding="utf-8") as f:
                    raw = json.load(f)
            except FileNotFoundError:
                raise ConfigError(f"{source}: config file not found") from None
            except json.JSONDecodeError as e:
                raise ConfigError(f"{source}: not valid JSON ({e})") from None
            if not isinstance(raw, dict):
                raise ConfigError(f"{source}: the top level must be a JSON object, got {type(raw).__name__}")
        else:
            raise ConfigError(f"config must be a path, a dict or None, got {type(config).__name__}")
        if task is not None:
            raw["task"] = task
        if dump_path is not None:
            raw["dump_path"] = os.fspath(dump_path)
        if level is not None:
            raw["level"] = level
        if step is not None:
            raw["step"] = step
        return cls._from_raw(raw, source)

    @classmethod
    def _from_raw(cls, raw: dict[str, Any], source: str) -> DumpConfig:
        task = raw.get("task") or "statistics"
        if task not in TASKS:
            extra = " (an msProbe task nbdebug does not write)" if task in _MSPROBE_TASKS else ""
            raise ConfigError(f"{source}: task {task!r}{extra} is not supported; choose one of {', '.join(TASKS)}")
        level = raw.get("level") or "L1"
        if level not in LEVELS:
            raise ConfigError(f"{source}: level {level!r} is not supported; choose one of {', '.join(LEVELS)}")
        dump_path = raw.get("dump_path")
        if dump_path is not None and not isinstance(dump_path, str):
            raise ConfigError(f"{source}: 'dump_path' must be a string, got {dump_path!r}")
        for key in ("extra_info", "async_dump"):
            if key in raw and not isinstance(raw[key], bool):
                raise ConfigError(f"{source}: {key!r} must be true or false, got {raw[key]!r}")
        precision = raw.get("precision", "low")
        if precision not in PRECISIONS:
            raise ConfigError(f"{source}: 'precision' must be one of {PRECISIONS}, got {precision!r}")
        risk = raw.get("risk_level") or "FOCUS"
        if risk not in RISK_LEVELS:
            raise ConfigError(f"{source}: 'risk_level' must be one of {RISK_LEVELS}, got {risk!r}")
        block = raw.get(task) or {}
        if not isinstance(block, dict):
            raise ConfigError(f"{source}: the {task!r} block must be an object, got {type(block).__name__}")
        where = f"{source} [{task}]"
        scope = _str_list(block.get("scope"), "scope", where)
        if scope and len(scope) != 2:
            raise ConfigError(f"{where}: 'scope' takes [start name, end name] (2 names), got {len(scope)}: {scope}")
        names = _str_list(block.get("list"), "list", where)
        for name in names:
            if name.startswith("name-regex(") and name.endswith(")"):
                try:
                    re.compile(name[len("name-regex("):-1])
                except re.error as e:
                    raise ConfigError(f"{where}: 'list' entry {name!r} is not a valid regex ({e})") from None
        data_mode = _str_list(block.get("data_mode"), "data_mode", where) or ["all"]
        for mode in data_mode:
            if mode not in DATA_MODES:
                raise ConfigError(f"{where}: 'data_mode' element {mode!r} is not one of {', '.join(DATA_MODES)}")
        if "all" in data_mode and len(data_mode) != 1:
            raise ConfigError(f"{where}: 'data_mode' 'all' cannot be combined with other modes, got {data_mode}")
        summary = block.get("summary_mode") or "statistics"
        if task == "tensor":
            summary = "statistics"  # msProbe reads summary_mode from the statistics block only
        if summary not in SUMMARY_MODES:
            raise ConfigError(f"{where}: 'summary_mode' {summary!r} is not supported; choose one of "
                              f"{', '.join(SUMMARY_MODES)}")
        return cls(task=task, dump_path=dump_path, level=level,
                   step=_steps_or_ranks(raw.get("step"), "step", source),
                   rank=_steps_or_ranks(raw.get("rank"), "rank", source),
                   extra_info=raw.get("extra_info", True), async_dump=raw.get("async_dump", False),
                   precision=precision, risk_level=risk, scope=scope, list=names, data_mode=data_mode,
                   summary_mode=summary, source=source)

    def to_dict(self) -> dict[str, Any]:
        """The config as msProbe's ``config.json`` layout."""
        block: dict[str, Any] = {"scope": list(self.scope), "list": list(self.list), "data_mode": list(self.data_mode)}
        if self.task == "statistics":
            block["summary_mode"] = self.summary_mode
        return {"task": self.task, "dump_path": self.dump_path, "rank": list(self.rank), "step": list(self.step),
                "level": self.level, "extra_info": self.extra_info, "async_dump": self.async_dump,
                "precision": self.precision, "risk_level": self.risk_level, self.task: block}

    # -- filters ----------------------------------------------------------------------------------
    def allowed(self, direction: str, io: str) -> bool:
        """msProbe's data_mode rule: does ``direction`` (forward/backward) + ``io`` (input/output) get dumped?"""
        modes = set(self.data_mode)
        if "all" in modes:
            return True
        if "forward" not in modes and "backward" not in modes:
            modes |= {"forward", "backward"}
        if "input" not in modes and "output" not in modes:
            modes |= {"input", "output"}
        return direction in modes and io in modes

    def dumps_step(self, step: int) -> bool:
        return not self.step or step in self.step

    def past_last_step(self, step: int) -> bool:
        return bool(self.step) and step > max(self.step)

    def dumps_rank(self, rank: int | None) -> bool:
        return not self.rank or rank in self.rank

    @property
    def needs_data(self) -> bool:
        """Whether tensor files are written (``tensor`` task)."""
        return self.task == "tensor"
