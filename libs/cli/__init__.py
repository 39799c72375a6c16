"""One command-line convention for every `prime-*` command (see `convention.py`)."""

from .convention import (
    FLAG_NAMES,
    CliParser,
    SettingsFlags,
    add_settings,
    fail,
    new_parser,
    package_version,
)

__all__ = [
    "FLAG_NAMES",
    "CliParser",
    "SettingsFlags",
    "add_settings",
    "fail",
    "new_parser",
    "package_version",
]
