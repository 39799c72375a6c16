"""Command lines generated from pydantic settings: one convention for every `prime-*` command.

A service's flags are its settings class, laid out by pydantic-settings' own generator
(`CliSettingsSource` on a parser of ours): each field becomes `--field-name` with its
description, its default and the environment variable it also reads
(`--max-rollouts INT  Stop after this many submissions (0: never). (default: 0)
[env: PRIME_WORKER_MAX_ROLLOUTS]`); a bool becomes `--flag` or `--no-flag`; a list takes
`--relay A --relay B`, `A,B` or JSON. A flag beats its variable, which beats the default.

typer was the other candidate and lost: its options are function parameters, so every setting
would be written twice (settings class and signature) and its help could not name the variable
pydantic-settings reads; nor is it installed in the service images. pydantic-settings is already
every service's dependency. This module adds only what the library leaves to its caller:

- `new_parser`: `--version`, and usage errors on one line with exit code 2 (argparse prints a
  usage block first);
- `FLAG_NAMES`: one name for one thing in every tool (`--pool`, `--ledger`, `--relay`,
  `--trainer`); the field's own kebab-case name stays accepted, hidden from `--help`. Field names
  and `PRIME_*` variables never change (compose files and launchers set them);
- nested models (the recipe, the loss, the rate limits) are set by environment only: the recipe
  is a settings class of its own that reads `PRIME_RECIPE_*`, and a dotted flag would replace it
  whole, dropping those variables. `--help` names their variables at the end;
- `SettingsFlags.load`: a bad value becomes one line per bad setting naming its flag and its
  variable (`prime-worker join: --pool: input should be greater than or equal to 1, got '0'
  (PRIME_WORKER_POOL_ID)`), exit code 2, never a pydantic dump.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Generic, NoReturn, TypeVar, get_args

from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, CliSettingsSource, CliSuppress, SettingsError

S = TypeVar("S", bound=BaseSettings)

DISTRIBUTION = "prime-swarm"

# Settings field -> its flag in every tool that has the field (the field name is a hidden alias).
FLAG_NAMES = {
    "pool_id": "pool",
    "ledger_address": "ledger",
    "relays": "relay",
    "trusted_trainer": "trainer",
    "parents": "parent",
    "worker_backends": "backend",
}

LOG_NOTE = "Logs: text on a terminal, JSON lines otherwise (PRIME_LOG_FORMAT=text|json forces one)."

_METAVARS = {"str": "TEXT", "int": "INT", "float": "FLOAT", "Path": "PATH", "bool": "BOOL"}


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def fail(prog: str, message: str) -> NoReturn:
    """One line on stderr, exit code 2: what every bad argument or setting gets."""
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(2)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line; its subcommands are CliParsers too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see {self.prog} --help)")


def new_parser(prog: str, description: str | None, epilog: str | None = None) -> CliParser:
    """The top-level parser of a console script, with `--version`."""
    parser = CliParser(prog=prog, description=description, epilog=epilog)
    parser.add_argument(
        "--version",
        action="version",
        version=f"{prog} {package_version()}",
        help="print the version",
    )
    return parser


@dataclass
class SettingsFlags(Generic[S]):
    """The flags of one settings class on one parser; `load` builds the settings from them."""

    settings_cls: type[S]
    prog: str
    source: CliSettingsSource[Any]
    flags: dict[str, str]  # field name -> the flag shown for it

    def load(self, parsed: argparse.Namespace, **fixed: Any) -> S:
        """Settings from the flags given, then `PRIME_*` variables, then defaults; `fixed` sets
        fields that have no flag (e.g. the relay's mode, its subcommand). Exits 2 on bad values."""
        try:
            return self.settings_cls(_cli_settings_source=self.source(parsed_args=parsed), **fixed)
        except ValidationError as exc:
            lines = [self._problem(exc.title, err) for err in exc.errors(include_url=False)]
        except SettingsError as exc:  # a list or JSON value that does not parse
            lines = [self._unparsable(str(exc))]
        print("\n".join(f"{self.prog}: {line}" for line in lines), file=sys.stderr)
        sys.exit(2)

    def env_var(self, name: str) -> str:
        names = self.source.env_var_names.get(name)
        return names[0] if names else _env_prefix(self.settings_cls) + name.upper()

    def _problem(self, title: str, err: Mapping[str, Any]) -> str:
        loc = [str(part) for part in err["loc"]]
        message = _message(err)
        cls: type[BaseModel] = self.settings_cls
        if title != cls.__name__:
            # Raised by a nested settings class reading its own variables (the recipe's
            # PRIME_RECIPE_*) inside this class's default factory.
            nested = [c for c in _nested_models(cls).values() if c.__name__ == title]
            if not nested:
                return f"{title}: {'.'.join(loc)}: {message}"
            cls = nested[0]
        elif not loc:  # a check across fields
            return message
        elif loc[0] in self.flags:  # the field itself, or an item of its list
            return f"{self.flags[loc[0]]}: {message} ({self.env_var(loc[0])})"
        # A field set by environment only (a nested model): its variable, and where inside it.
        delimiter = cls.model_config.get("env_nested_delimiter")
        if delimiter:
            return f"{_env_prefix(cls)}{delimiter.join(loc).upper()}: {message}"
        where = f" at {'.'.join(loc[1:])}" if len(loc) > 1 else ""
        return f"{_env_prefix(cls)}{loc[0].upper()}: {message}{where}"

    def _unparsable(self, text: str) -> str:
        match = re.search(r'(?:field "|for )(\w+)', text)
        if match and match.group(1) in self.flags:
            name = match.group(1)
            return f"{self.flags[name]}: cannot parse the value ({self.env_var(name)})"
        return text


def add_settings(
    parser: argparse.ArgumentParser,
    settings_cls: type[S],
    *,
    hide: Iterable[str] = (),
    aliases: Mapping[str, Iterable[str]] | None = None,
) -> SettingsFlags[S]:
    """Add a flag for each field of `settings_cls` to `parser` (a command or a subcommand).

    `hide`: fields with no flag (set by the command itself, or by environment only).
    `aliases`: further hidden spellings of a field's flag, e.g. an older name.
    """
    hidden_fields = set(hide)
    extra = {name: [f"--{a}" for a in names] for name, names in (aliases or {}).items()}
    flags: dict[str, str] = {}

    def add_argument(context: Any, *names: str, **kwargs: Any) -> argparse.Action | None:
        if kwargs.get("help") == argparse.SUPPRESS:
            return None  # a hidden field gets no flag at all, not an undocumented one
        dest = kwargs["dest"]
        shown = f"--{FLAG_NAMES[dest]}" if dest in FLAG_NAMES else names[0]
        hidden = [n for n in names if n != shown] + extra.get(dest, [])
        metavar = kwargs.get("metavar")
        if isinstance(metavar, str):
            inner = re.fullmatch(r"list\[(.+)\]", metavar)  # --relay A --relay B, or A,B
            metavar = inner.group(1) if inner else metavar
            kwargs["metavar"] = (
                metavar if "{" in metavar else _METAVARS.get(metavar, metavar.upper())
            )
        action = context.add_argument(shown, **kwargs)
        if hidden:
            context.add_argument(*hidden, **{**kwargs, "help": argparse.SUPPRESS})
        flags[dest] = shown
        return action

    env_only = _nested_models(settings_cls)
    source: CliSettingsSource[Any] = CliSettingsSource(
        _cli_view(settings_cls, hidden_fields | set(env_only)),
        root_parser=parser,
        cli_kebab_case=True,
        cli_show_env_vars=True,
        cli_implicit_flags="toggle",
        cli_hide_none_type=True,
        cli_avoid_json=True,
        add_argument_method=add_argument,
        formatter_class=HelpFormatter,
    )
    notes = [parser.epilog] if parser.epilog else []
    shown_env_only = {n: c for n, c in env_only.items() if n not in hidden_fields}
    if shown_env_only:
        listed = ", ".join(
            f"{name} ({_nested_env(settings_cls, name, cls)})"
            for name, cls in shown_env_only.items()
        )
        notes.append(textwrap.fill(f"Set by environment only: {listed}.", 90))
    notes.append(textwrap.fill(LOG_NOTE, 90))
    parser.epilog = "\n\n".join(notes)
    return SettingsFlags(settings_cls, parser.prog, source, flags)


# --- helpers -------------------------------------------------------------------------------


def _env_prefix(cls: type[BaseModel]) -> str:
    return str(cls.model_config.get("env_prefix", "")).upper()


def _nested_models(settings_cls: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Fields holding a model (the recipe, the loss, rate limits): environment only."""
    found = {}
    for name, info in settings_cls.model_fields.items():
        for t in (info.annotation, *get_args(info.annotation)):
            if isinstance(t, type) and issubclass(t, BaseModel):
                found[name] = t
    return found


def _nested_env(settings_cls: type[BaseModel], name: str, cls: type[BaseModel]) -> str:
    if issubclass(cls, BaseSettings) and _env_prefix(cls):
        return f"{_env_prefix(cls)}*"  # a settings class of its own (the recipe)
    delimiter = settings_cls.model_config.get("env_nested_delimiter")
    var = _env_prefix(settings_cls) + name.upper()
    return f"{var}{delimiter}*" if delimiter else f"{var} as JSON"


def _cli_view(settings_cls: type[S], hidden: set[str]) -> type[S]:
    """The class the flags are generated from: `settings_cls` with `hidden` fields suppressed
    and factory defaults shown as values (`[]`, not `default factory: list`). Only its layout is
    used; values are always validated by `settings_cls` itself."""
    overrides: dict[str, Any] = {}
    for name, info in settings_cls.model_fields.items():
        if name in hidden:
            overrides[name] = (CliSuppress[info.annotation], info)  # type: ignore[valid-type]
        elif info.default_factory is not None and not info.default_factory_takes_validated_data:
            default = info.default_factory()  # type: ignore[call-arg]
            overrides[name] = (info.annotation, Field(default, description=info.description))
    if not overrides:
        return settings_cls
    return create_model(settings_cls.__name__, __base__=settings_cls, **overrides)


def _message(err: Mapping[str, Any]) -> str:
    if err["type"] == "missing":
        return "required"
    text = str(err["msg"]).removeprefix("Value error, ")
    text = text[:1].lower() + text[1:]
    value = err.get("input")
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        shown = repr(value)
        if len(shown) <= 60:
            text += f", got {shown}"
    return text
