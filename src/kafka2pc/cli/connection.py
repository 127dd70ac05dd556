"""The connection arguments every ``kafka2pc`` command takes, and the settings they make."""

from __future__ import annotations

import argparse

from kafka2pc.config import ClientConfig


def _config_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` and repeated ``--config KEY=VALUE``."""
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT[,HOST:PORT]",
                        help="the cluster's bootstrap servers")
    parser.add_argument("--config", "-X", action="append", type=_config_pair, metavar="KEY=VALUE",
                        help="a client setting with Kafka's dotted name (security.protocol, sasl.*, ssl.*); repeatable")


def client_settings(args: argparse.Namespace) -> dict[str, object]:
    """The client settings the arguments give (Kafka's dotted names)."""
    settings: dict[str, object] = dict(args.config or [])
    settings["bootstrap.servers"] = args.bootstrap
    return settings


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The validated client configuration the arguments give."""
    return ClientConfig.from_dict(client_settings(args))
