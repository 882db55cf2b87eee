"""Building settings objects with one-line errors instead of pydantic tracebacks.

`StrictSettings` is the base of every area's settings class: a misspelt `<prefix>*` variable in the environment
or `.env` (SEARCHRL_RETRIEVAL_BACKEN=dense), or an unknown keyword argument, is a ConfigError naming the closest
valid name, where pydantic-settings would silently ignore it (nanoGPT `configurator.py`: unknown keys raise).
Other areas' variables in a shared `.env` are not this class's business and are left alone.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from searchrl.errors import ConfigError

_S = TypeVar("_S", bound=BaseSettings)

# SEARCHRL_* variables that are not fields of a settings class: logging, the CLI, and the SkyPilot tasks' envs.
OTHER_ENV_NAMES = frozenset(
    {
        "SEARCHRL_DEBUG",  # searchrl/cli: add tracebacks to `error:` lines
        "SEARCHRL_LOG_LEVEL",  # searchrl/logs.py
        "SEARCHRL_SKY_PYTHON",  # searchrl/deploy/skypilot.py: the interpreter that has SkyPilot
        "SEARCHRL_INDEX_BUCKET",  # sky/retrieval.yaml, sky/index-build.yaml
        "SEARCHRL_INDEX_MOUNT",
        "SEARCHRL_INDEX_FINGERPRINT",
        "SEARCHRL_PROBE_DELAY_S",  # sky/retrieval.yaml
    }
)


def env_names(cls: type[BaseSettings]) -> set[str]:
    """Every variable name (upper case) that sets a field of `cls`: <env_prefix><FIELD> and the aliases."""
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    names = {f"{prefix}{field.upper()}" for field in cls.model_fields}
    for info in cls.model_fields.values():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices if isinstance(choice, str))
        elif isinstance(alias, str):
            names.add(alias.upper())
    return names


def init_names(cls: type[BaseSettings]) -> set[str]:
    """Keyword arguments `cls(...)` accepts: field names and their aliases."""
    names = set(cls.model_fields)
    for info in cls.model_fields.values():
        if isinstance(info.validation_alias, AliasChoices):
            names.update(str(choice) for choice in info.validation_alias.choices)
        elif isinstance(info.validation_alias, str):
            names.add(info.validation_alias)
    return names


def unknown_name_error(names: Iterable[str], valid: Iterable[str], where: str) -> ConfigError:
    """One line: the first unknown name, where it came from, and the closest valid name (difflib)."""
    unknown = sorted(names)
    close = difflib.get_close_matches(unknown[0], sorted(valid), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "check the spelling"
    more = f" (+{len(unknown) - 1} more: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
    return ConfigError(f"unknown setting {unknown[0]} {where}: {hint}{more}")


def _env_file_keys(env_file: Any) -> dict[str, str]:
    """Keys of the .env file(s) pydantic-settings would read, each mapped to its file name."""
    from dotenv import dotenv_values

    files = [env_file] if isinstance(env_file, str | Path) else list(env_file or [])
    out: dict[str, str] = {}
    for file in files:
        if isinstance(file, str | Path) and Path(file).is_file():
            out.update({k: str(file) for k in dotenv_values(file) if k})
    return out


def check_names(cls: type[BaseSettings], values: Mapping[str, Any]) -> None:
    """Raise ConfigError for an unknown keyword argument or a stray <env_prefix>* variable (env or .env)."""
    # pydantic-settings options start with "_" (_env_file, ...); anything else must name a field or alias.
    valid_kwargs = init_names(cls)
    unknown = [k for k in values if not k.startswith("_") and k not in valid_kwargs]
    if unknown:
        raise unknown_name_error(unknown, valid_kwargs, f"passed to {cls.__name__}")
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    if not prefix:
        return
    valid = env_names(cls)
    in_env = [k for k in os.environ if k.upper().startswith(prefix) and k.upper() not in valid]
    if in_env:
        raise unknown_name_error([k.upper() for k in in_env], valid, "in the environment")
    files = _env_file_keys(values.get("_env_file", cls.model_config.get("env_file")))
    in_file = [k for k in files if k.upper().startswith(prefix) and k.upper() not in valid]
    if in_file:
        raise unknown_name_error([k.upper() for k in in_file], valid, f"in {files[in_file[0]]}")


def unknown_env_keys(keys: Iterable[str], classes: Iterable[type[BaseSettings]]) -> list[str]:
    """The SEARCHRL_* names in `keys` that no settings class reads and OTHER_ENV_NAMES does not list."""
    valid = set(OTHER_ENV_NAMES).union(*(env_names(cls) for cls in classes))
    return sorted(k for k in keys if k.upper().startswith("SEARCHRL_") and k.upper() not in valid)


class StrictSettings(BaseSettings):
    """BaseSettings that refuses misspelt names instead of ignoring them (see the module docstring)."""

    def __init__(self, **values: Any) -> None:
        check_names(type(self), values)
        super().__init__(**values)

    def with_changes(self, **changes: Any) -> Self:
        """A copy with `changes`, validated as any settings are: a misspelled key or a bad value fails here.

        pydantic's `model_copy(update=...)` validates nothing (with pydantic 2.13/2.14 `update={"typo": 3}` passes
        silently, and a value its validators would refuse is kept), so every copy of settings in the product is made
        with this instead (tests/trainer/test_settings.py fails on a product module that calls model_copy).
        """
        return type(self).model_validate({**self.model_dump(), **changes})


def area_config(env_prefix: str) -> SettingsConfigDict:
    """The model_config of an area's settings class: its `<env_prefix>*` variables and the repo's one `.env`,
    whose other areas' keys are ignored (StrictSettings catches our own typos); a field is set by its name or
    its alias (TRAIN_BATCH_SIZE, RETRIEVAL_API_KEY)."""
    return SettingsConfigDict(env_prefix=env_prefix, env_file=".env", extra="ignore", populate_by_name=True)


def load_settings(cls: type[_S], **overrides: Any) -> _S:
    """`cls(**overrides)` (flags > env > .env > defaults); a bad value raises ConfigError naming the knob.

    The message names the field, its env var and what is wrong, never the value of a secret.
    """
    try:
        return cls(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or cls.__name__
        prefix = str(cls.model_config.get("env_prefix", ""))
        # a field name gets its env var added; an alias such as TRAIN_BATCH_SIZE already is the env var
        env = f" (env {prefix}{field.upper()})" if field in cls.model_fields and prefix else ""
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ConfigError(f"{field}{env}: {msg}{more}") from None


__all__ = [
    "OTHER_ENV_NAMES",
    "StrictSettings",
    "area_config",
    "check_names",
    "env_names",
    "init_names",
    "load_settings",
    "unknown_env_keys",
    "unknown_name_error",
]
