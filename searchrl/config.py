"""Building settings objects with one-line errors instead of pydantic tracebacks."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from searchrl.errors import ConfigError

S = TypeVar("S", bound=BaseSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
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


__all__ = ["load_settings"]
