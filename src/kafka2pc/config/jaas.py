"""``sasl.jaas.config``, the Java client's login settings, read (never evaluated) into kafka2pc's own keys.

The grammar is JAAS's: ``<LoginModule class> <flag> [option=value ...];`` where a value is a quoted string (double
or single quotes, as Java's tokenizer takes both; ``\\`` escapes) or a bare word. One login module per client, as
Kafka's clients require.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from kafka2pc.errors import ConfigError

KEY = "sasl.jaas.config"
_TOKEN = re.compile(r"""\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|([^\s=;"']+)|(=)|(;))""", re.DOTALL)
_FLAGS = ("required", "requisite", "sufficient", "optional")


@attrs.frozen
class LoginModule:
    """A login module named in ``sasl.jaas.config``, with its options."""

    class_name: str
    options: Mapping[str, str]


def parse(value: str) -> LoginModule:
    """The one login module ``value`` names; a ConfigError says what is malformed (never quoting a value)."""
    words: list[tuple[str, str]] = []  # (kind, text): kind is "word", "quoted", "=" or ";"
    position = 0
    while position < len(value):
        if value[position:].strip() == "":
            break
        match = _TOKEN.match(value, position)
        if match is None:
            raise ConfigError(KEY, f"cannot read it at character {position + 1}")
        double_quoted, single_quoted, word, equals, _ = match.groups()
        quoted = double_quoted if double_quoted is not None else single_quoted
        if quoted is not None:
            words.append(("quoted", re.sub(r"\\(.)", r"\1", quoted)))
        elif word is not None:
            words.append(("word", word))
        else:
            words.append(("=" if equals else ";", ""))
        position = match.end()
    if len(words) < 3 or words[0][0] != "word" or words[1][0] != "word" or words[1][1].lower() not in _FLAGS:
        raise ConfigError(KEY, "expected '<LoginModule class> required [option=\"value\" ...];'")
    if words[-1][0] != ";":
        raise ConfigError(KEY, "must end with ';'")
    body = words[2:-1]
    if any(kind == ";" for kind, _ in body):
        raise ConfigError(KEY, "names more than one login module; a Kafka client takes exactly one")
    if len(body) % 3:
        raise ConfigError(KEY, "expected option=value pairs after the flag")
    options: dict[str, str] = {}
    for index in range(0, len(body), 3):
        (name_kind, name), (eq_kind, _), (value_kind, option_value) = body[index:index + 3]
        if name_kind != "word" or eq_kind != "=" or value_kind not in ("word", "quoted"):
            raise ConfigError(KEY, f"expected option=value pairs after the flag (near option {index // 3 + 1})")
        if name in options:
            raise ConfigError(KEY, f"option {name!r} is given twice")
        options[name] = option_value
    return LoginModule(class_name=words[0][1], options=options)
