"""What several `searchrl` verbs share: how a verb is declared, the retrieval flags, the settings built from them,
and the benchmark verbs' one handler.

A verb is declared once, by `verb` (its name and handler; its help and description are the handler's docstring,
as click's `@command` takes them), and a verb with verbs of its own by `group`; every area module uses them instead
of repeating argparse's add_parser, argument_default and set_defaults.

A flag that means the same in several verbs (`--data-dir`, `--corpus`, `--index-type`, `--out`, ...) is defined
once in `FLAGS`, so its spelling, type and dest agree everywhere; a verb whose help says more about it passes its
own text. Every verb's flags default to argparse.SUPPRESS (see searchrl/cli/__init__.py), so `given` hands
pydantic-settings only what the user typed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.cli import given

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

Handler = Callable[[argparse.Namespace], int]


def verb(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help: str | None = None,
    description: str | None = None,
    *,
    suppress: bool = True,
) -> argparse.ArgumentParser:
    """Add the verb `name` to `sub`, run by `handler`; returns its parser for the verb's own flags.

    Without `help`, the texts are the handler's docstring, as click's `@command` takes them: its first paragraph is
    the verb's line in the parent's list, the rest (if any) the description on its own --help; so a verb's words
    are written once, beside the code they describe. argparse folds the docstring's line breaks into spaces.
    `suppress` (the default): a flag not given is absent from the namespace, so pydantic-settings keeps env > .env >
    default precedence (`given`); a verb whose flags carry their own defaults passes False.
    """
    if help is None:
        help, description = _doc_texts(name, handler)
    p = sub.add_parser(
        name, help=help, description=description, argument_default=argparse.SUPPRESS if suppress else None
    )
    p.set_defaults(handler=handler)
    return p


def group(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    register: Callable[..., None],
    dest: str,
    *,
    usage_on_stdout: bool = False,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add `name`, a verb with verbs of its own (`searchrl index build`), and return its verbs; the chosen one's
    name lands in `dest`. Its help and description are the docstring of `register`, the function that declares
    it (as click's `@group` takes its function's). Given without a verb, it prints its help (on stderr, or stdout
    for `usage_on_stdout`) and exits 2."""
    help, description = _doc_texts(name, register)
    p = sub.add_parser(name, help=help, description=description)
    verbs = p.add_subparsers(dest=dest, metavar="VERB")

    def usage(_args: argparse.Namespace) -> int:
        p.print_help(sys.stdout if usage_on_stdout else sys.stderr)
        return 2

    p.set_defaults(handler=usage)
    return verbs


def _doc_texts(name: str, function: Callable[..., Any]) -> tuple[str, str | None]:
    """A verb's help (the docstring's first paragraph) and description (the rest, or None)."""
    if not function.__doc__:
        raise TypeError(f"verb {name!r}: no help given and no docstring on {function.__name__}")
    help, _, rest = inspect.cleandoc(function.__doc__).partition("\n\n")
    return help, rest or None


# dest -> (flag, add_argument keywords): the retrieval flags several verbs take
FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "corpus": ("--corpus", {"help": "bundled | wiki18-100k | wiki18 | path to Search-R1 JSONL(.gz)"}),
    "encoder": (
        "--encoder",
        {"help": "bundled-minilm | intfloat/e5-base-v2 | BAAI/bge-base-en-v1.5 | folder"},
    ),
    "index_type": ("--index-type", {"help": "FAISS factory string (default Flat)"}),
    "data_dir": ("--data-dir", {"help": "where corpora and indexes live (default ./data)"}),
    "out_dir": (
        "--out",
        {"type": Path, "metavar": "OUT", "help": "directory for JSON results (default outputs/bench)"},
    ),
}


def add_flags(p: argparse.ArgumentParser, *names: str, helps: Mapping[str, str] | None = None) -> None:
    """Add the shared flags `names` to `p` in that order; `helps` gives one of them this verb's own help text."""
    for name in names:
        flag, kwargs = FLAGS[name]
        p.add_argument(
            flag, dest=name, **{**kwargs, **({"help": helps[name]} if helps and name in helps else {})}
        )


def retrieval_settings(args: argparse.Namespace, *names: str, **fixed: object) -> RetrievalSettings:
    """RetrievalSettings from the flags among `names` the user gave (env, .env and defaults for the rest) and the
    values this verb fixes."""
    from searchrl.config import load_settings
    from searchrl.retrieval.settings import RetrievalSettings

    return load_settings(RetrievalSettings, **fixed, **given(args, *names))


def bounded(
    args: argparse.Namespace, *flags: tuple[str, str, int], says: str = "must be at least {low}"
) -> dict[str, object]:
    """The whole-number flags given, keyed by their keyword (flag dest, keyword, lowest allowed); one below it is a
    one-line error naming the flag (`says` is the verb's wording of the bound)."""
    from searchrl.errors import ConfigError

    out: dict[str, object] = {}
    for name, dest, low in flags:
        if hasattr(args, name):
            value = getattr(args, name)
            if value < low:
                raise ConfigError(f"--{name.replace('_', '-')}: {says.format(low=low)}, got {value}")
            out[dest] = value
    return out


def factory_strings(value: str) -> list[str]:
    """A `--types` value: ';' separates FAISS factory strings because they hold commas themselves (IVF256,SQ8)."""
    return [t.strip() for t in value.split(";") if t.strip()]


def bench_handler(
    run: str,
    report: str,
    kwargs: Callable[[argparse.Namespace], dict[str, object]],
    settings: tuple[str, ...] = ("data_dir",),
) -> Handler:
    """The handler of a benchmark verb: RetrievalSettings from the flags `settings`, then `kwargs(args)` (which
    checks the verb's own flags), then `run(settings, **kwargs)` and `report(result)` on stdout; exit 0.

    `run` and `report` are 'module:function' strings, imported when the verb runs, so that `searchrl --help` never
    imports a benchmark (numpy, faiss, torch). The handler carries `kwargs`'s docstring, the verb's help for `verb`.
    """

    def handler(args: argparse.Namespace) -> int:
        from searchrl.logs import setup_logging

        setup_logging()
        loaded = retrieval_settings(args, *settings)
        result = _function(run)(loaded, **kwargs(args))
        print(_function(report)(result))  # noqa: T201 - results go to stdout
        return 0

    handler.__doc__ = kwargs.__doc__
    return handler


def _function(path: str) -> Callable[..., Any]:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
