"""How the runtime and the gateway read their settings and run, once for both (``tidal.common``).

A process has two kinds of settings.  Its *flags* (where it listens, how it logs, which file
holds its configuration) come from the command line or the environment: a
:class:`ProcessSettings` subclass read by pydantic-settings, each field from ``--field-name``
or else ``TIDAL_FIELD_NAME`` (the flag wins; an empty variable counts as unset; fields marked
:data:`CLI_ONLY` have no variable), the names in :mod:`tidal.common.contract`.  Its
*configuration* (the typed model in ``runtime/config.py`` or ``gateway/config.py``) comes from
a YAML or JSON file or inline JSON in a variable (:func:`read_config_data`).  Either, invalid,
is a :class:`ConfigError` whose message names the field, the flag or the variable.

:func:`run_process` is the rest of both ``__main__`` modules: read the flags, set up logging,
start (a ``ConfigError`` there too exits 2 at once), then serve until SIGTERM/SIGINT; the
first signal sets the stop event (the server drains), a second ends the serving at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .contract import ENV_PREFIX

# A field with this json_schema_extra is read from the command line only.
CLI_ONLY: dict[str, Any] = {"cliOnly": True}


class ConfigError(Exception):
    """The settings or the configuration could not be read or are invalid; the message names
    the field."""


def format_validation_error(error: ValidationError, what: str) -> str:
    """One line per offending field, named by its dotted (camelCase) path."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {where}: {item['msg']}")
    return f"invalid {what}:\n" + "\n".join(lines)


def _read_file(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from None
    try:
        return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"configuration file {path} is not valid YAML/JSON: {exc}") from None


def read_config_data(
    path: str | None,
    env: Mapping[str, str],
    *,
    json_variable: str,
    path_variable: str | None = None,
    what: str,
) -> dict[str, Any]:
    """A configuration's raw mapping, first match wins: the file ``path`` (``--config``), the
    file the variable ``path_variable`` names, inline JSON in ``json_variable``; else empty."""
    if path is not None:
        data = _read_file(path)
    elif path_variable is not None and env.get(path_variable):
        data = _read_file(env[path_variable])
    elif env.get(json_variable):
        try:
            data = json.loads(env[json_variable])
        except ValueError as exc:
            raise ConfigError(f"{json_variable} is not valid JSON: {exc}") from None
    else:
        data = {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid {what}: the top level must be a mapping")
    return data


class _Environment(EnvSettingsSource):
    """The environment, less the command-line-only fields."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field.json_schema_extra == CLI_ONLY:
            return None, field_name, False
        return super().get_field_value(field, field_name)


class ProcessSettings(BaseSettings):
    """What every tidal server process takes from its command line and environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        frozen=True,
    )

    config: str | None = Field(
        default=None, description="YAML or JSON configuration file", json_schema_extra=CLI_ONLY
    )
    host: str = Field(default="0.0.0.0", description="listen address")
    port: int = Field(default=8080, ge=0, le=65535, description="HTTP port")
    grpc_port: int | None = Field(default=None, ge=0, le=65535, description="gRPC port; 0: none")
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    check_config: bool = Field(
        default=False, description="validate the configuration and exit", json_schema_extra=CLI_ONLY
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _Environment(settings_cls))

    @classmethod
    def environment_names(cls) -> set[str]:
        """The variables these settings read (the rest are command-line only)."""
        return {
            ENV_PREFIX + name.upper()
            for name, field in cls.model_fields.items()
            if field.json_schema_extra != CLI_ONLY
        }


Settings = TypeVar("Settings", bound=ProcessSettings)


def read_settings(cls: type[Settings], argv: list[str], prog: str) -> Settings:
    """``cls`` from the command line ``argv`` and the environment; ``ConfigError`` naming the
    flag and the variable of each invalid value (an unknown flag exits 2, as argparse does)."""
    try:
        return cls(_cli_parse_args=argv, _cli_prog_name=prog)
    except ValidationError as exc:
        lines = []
        for item in exc.errors():
            name = str(item["loc"][0]) if item["loc"] else ""
            flag = "--" + name.replace("_", "-")
            field = cls.model_fields.get(name)
            where = (
                flag
                if field is None or field.json_schema_extra == CLI_ONLY
                else (f"{flag} / {ENV_PREFIX}{name.upper()}")
            )
            lines.append(f"  {where}: {item['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None


Serve = Callable[[asyncio.Event], Awaitable[None]]


@dataclass(frozen=True)
class Serving:
    """What a process's start returns: how to serve until the stop event, on which loop."""

    serve: Serve
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None


async def _until_signalled(serve: Serve) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: stop draining, exit now
            task.cancel()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    with contextlib.suppress(asyncio.CancelledError):
        await serve(stop)


def run_process(
    prog: str,
    cls: type[Settings],
    argv: list[str] | None,
    start: Callable[[Settings], Serving | None],
) -> int:
    """Read the settings, log to stderr at their level, ``start`` (None: the configuration was
    only checked), serve until signalled.  Exit code 2, with the reason on stderr, for invalid
    settings or configuration and for a port that cannot be bound; else 0."""
    try:
        settings = read_settings(cls, sys.argv[1:] if argv is None else argv, prog)
        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        serving = start(settings)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if serving is None:
        print("configuration is valid")
        return 0
    try:
        with asyncio.Runner(loop_factory=serving.loop_factory) as runner:
            runner.run(_until_signalled(serving.serve))
    except OSError as exc:  # a port that cannot be bound
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0
