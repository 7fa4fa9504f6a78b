"""Reading a config: a TOML experiment file with the sections ``[data] [model] [diffusion] [train] [eval]`` (and
``[sweep]`` for grids), ``--set section.key=value`` overrides applied in order (a later one wins), every value checked
against its key's type and then validated (:mod:`diffmem.config.checks`). Values of ``--set`` are TOML literals
(``false``, ``0.001``, ``[8, 16]``, ``"adam"``); a bare word is taken as a string. Also a run folder's stored config.
"""
from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Union

from diffmem.config.checks import did_you_mean, validate, validate_sweep, validate_theory
from diffmem.config.run import RunConfig, upgrade_stored_config
from diffmem.config.sections import ALL_SECTIONS, SECTIONS, ConfigError, SweepConfig, TheoryConfig


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{where} = {value!r} has the wrong type: expected {_type_name(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: expected null")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} = {value!r} has the wrong type: expected a list like [1, 2]")
        (item_tp, *_) = typing.get_args(tp)
        items = [_coerce(v, item_tp, where) for v in value]
        return tuple(items) if origin is tuple else items
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer beyond float's range
                raise ConfigError(f"{where} = {str(value)[:12]}... is too large for a number; give a finite value, "
                                  "e.g. 0.01") from None
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - every annotation above is one of these
        raise TypeError(f"unsupported annotation {tp!r} for {where}")
    raise ConfigError(f"{where} = {value!r} has the wrong type: expected {_type_name(tp)}")


def _build_section(cls: type, section: str, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"unknown key '{section}.{key}'{did_you_mean(key, names)}; valid keys of [{section}]: "
                              + ", ".join(names))
        kwargs[key] = _coerce(value, hints[key], f"{section}.{key}")
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"train.lr=0.001"`` -> ("train", "lr", 0.001). The value is a TOML literal; a bare word is a string."""
    key, sep, raw = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(f"--set expects section.key=value, got '{text}' (e.g. --set train.steps=1000)")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, name, value


def merge_sections(base: dict[str, dict[str, Any]], overrides: list[str]) -> dict[str, dict[str, Any]]:
    """Apply ``--set`` overrides (in order) to a nested dict of TOML sections."""
    out = {k: dict(v) for k, v in base.items()}
    for text in overrides:
        section, name, value = parse_override(text)
        out.setdefault(section, {})[name] = value
    return out


def read_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass a TOML file like experiments/demo.toml")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file '{path}' is not valid TOML: {e}") from None
    for section, values in raw.items():
        if not isinstance(values, dict):
            raise ConfigError(f"'{section}' in {path} must be a [section] table; valid sections: "
                              + ", ".join(ALL_SECTIONS))
    return raw


def build_configs(sections: dict[str, dict[str, Any]]) -> tuple[RunConfig, SweepConfig]:
    """Nested dict of sections -> (validated RunConfig, SweepConfig)."""
    for section in sections:
        if section not in ALL_SECTIONS:
            raise ConfigError(f"unknown config section '[{section}]'{did_you_mean(section, list(ALL_SECTIONS))}; "
                              "valid sections: " + ", ".join(ALL_SECTIONS))
    built = {name: _build_section(cls, name, sections.get(name, {})) for name, cls in ALL_SECTIONS.items()}
    sweep = built.pop("sweep")
    run = RunConfig(**built)
    validate(run)
    validate_sweep(sweep, run)
    return run, sweep


def demo_config_path() -> Path:
    """experiments/demo.toml of the checkout this package was installed from (it may not exist: a wheel install)."""
    return Path(__file__).resolve().parents[2] / "experiments" / "demo.toml"


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> tuple[RunConfig, SweepConfig]:
    """Read a TOML experiment file (or none: the paper's defaults) and apply ``--set`` overrides."""
    base = read_toml(path) if path is not None else {}
    return build_configs(merge_sections(base, list(overrides)))


def load_theory_config(path: str | Path | None = None,
                       overrides: list[str] | tuple[str, ...] = ()) -> TheoryConfig:
    """The ``[theory]`` section of a TOML file (or the paper's numerics) with ``--set theory.key=value`` applied."""
    sections = merge_sections(read_toml(path) if path is not None else {}, list(overrides))
    extra = sorted(set(sections) - {"theory"})
    if extra:
        raise ConfigError(f"a theory config has only a [theory] section, not [{extra[0]}]; "
                          "use --set theory.key=value")
    cfg = _build_section(TheoryConfig, "theory", sections.get("theory", {}))
    validate_theory(cfg)
    return cfg


def config_from_dict(d: dict[str, Any]) -> RunConfig:
    """Inverse of ``RunConfig.to_dict`` (reads the ``config`` stored in a run folder's config.json, also one written
    by an older diffmem: see ``upgrade_stored_config``)."""
    run, _ = build_configs({k: v for k, v in upgrade_stored_config(d).items() if k in SECTIONS})
    return run
