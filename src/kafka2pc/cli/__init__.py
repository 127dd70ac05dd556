"""The ``kafka2pc`` command line: ``doctor``, ``txns``, ``audit``, ``recover`` and ``fleet``."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

from kafka2pc.cli.audit import add_audit_command
from kafka2pc.cli.doctor import add_doctor_command
from kafka2pc.cli.fleet import add_fleet_command
from kafka2pc.cli.recover import add_recover_command
from kafka2pc.cli.txns import add_txns_commands
from kafka2pc.errors import Kafka2pcError

__all__ = ["build_parser", "main"]


def _installed_version() -> str:
    try:
        return importlib.metadata.version("kafka2pc")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kafka2pc`` command."""
    parser = argparse.ArgumentParser(prog="kafka2pc", description="Kafka two-phase commit tools")
    parser.add_argument("--verbose", "-v", action="store_true", help="log kafka2pc's own debug messages")
    parser.add_argument("--version", action="version", version=f"kafka2pc {_installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_doctor_command(commands)
    add_txns_commands(commands)
    add_audit_command(commands)
    add_recover_command(commands)
    add_fleet_command(commands)
    return parser

def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kafka2pc`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        code: int = args.run(args)
    except Kafka2pcError as exc:
        command = " ".join(filter(None, (args.command, getattr(args, "txns_command", None))))
        print(f"kafka2pc {command}: error: {exc}", file=sys.stderr)
        return 1
    return code
