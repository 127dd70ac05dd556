"""The connection arguments every ``kafka2pc`` command takes, and the settings they make: ``--bootstrap``, a Java
``.properties`` file (``--command-config``, as Kafka's own tools take it) and repeated ``--config key=value``."""

from __future__ import annotations

import argparse
from pathlib import Path

import javaproperties

from kafka2pc.config import ClientConfig
from kafka2pc.errors import ConfigError


def _config_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        # the text may hold a secret typed with a space for '=': only its first word is shown
        first = text.split(maxsplit=1)[0] if text.strip() else text
        raise argparse.ArgumentTypeError(f"expected key=value, got {first!r}... without '=' (the rest is not shown: "
                                         "it may be a secret)")
    return key.strip(), value.strip()


def add_connection_args(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--bootstrap``, ``--command-config FILE`` and repeated ``--config KEY=VALUE``."""
    parser.add_argument("--bootstrap", "--bootstrap-server", required=required, metavar="HOST:PORT[,HOST:PORT]",
                        help="the cluster's bootstrap servers" + ("" if required else " (to look at Kafka too)"))
    parser.add_argument("--command-config", metavar="FILE", type=Path,
                        help="client settings in a Java .properties file (security.protocol, sasl.jaas.config, "
                             "ssl.truststore.location ...), as kafka-transactions.sh --command-config takes it")
    parser.add_argument("--config", "-X", action="append", type=_config_pair, metavar="KEY=VALUE",
                        help="a client setting, confluent-kafka's or the Java client's name; repeatable; overrides "
                             "the same key in --command-config")


def read_properties(path: Path) -> dict[str, str]:
    """The settings of a Java .properties file (escapes and continued lines as Java reads them)."""
    try:
        with path.open(encoding="latin-1") as handle:  # java.util.Properties' encoding
            return dict(javaproperties.load(handle))
    except OSError as exc:
        raise ConfigError("--command-config", f"cannot read {str(path)!r}: {exc.strerror}") from None


def client_settings(args: argparse.Namespace) -> dict[str, object]:
    """The client settings the arguments give (either client's key names)."""
    settings: dict[str, object] = {}
    if args.command_config is not None:
        settings.update(read_properties(args.command_config))
    settings.update(dict(args.config or []))
    settings["bootstrap.servers"] = args.bootstrap
    return settings


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The validated client configuration the arguments give."""
    return ClientConfig.from_dict(client_settings(args))
