"""Every configuration key kafka2pc accepts, the other names users write for it, and the keys it refuses with a
reason. :func:`canonical` turns what a user wrote (confluent-kafka/librdkafka names, Java client names,
``sasl.jaas.config``) into kafka2pc's one spelling; docs/configuration.md's table is :func:`markdown_table`."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping

import attrs

from kafka2pc.config import jaas
from kafka2pc.config.redaction import Secret
from kafka2pc.errors import ConfigError

log = logging.getLogger(__name__)


@attrs.frozen
class Key:
    """One accepted key: its name, the aliases that mean the same, and what it does."""

    name: str
    meaning: str
    aliases: tuple[str, ...] = ()
    secret: bool = False
    producer: bool = False


_CONNECTION = (
    Key("bootstrap.servers", "host:port list of brokers to start from", ("metadata.broker.list",)),
    Key("client.id", "the client id brokers log and quota by"),
    Key("security.protocol", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    Key("sasl.mechanism", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM or GSSAPI",
        ("sasl.mechanisms",)),
    Key("sasl.username", "the PLAIN or SCRAM user"),
    Key("sasl.password", "the PLAIN or SCRAM password", secret=True),
    Key("sasl.jaas.config", "Java login module: Plain, Scram, OAuthBearer, MSK IAM or Krb5 (read, not run)",
        secret=True),
    Key("sasl.oauthbearer.method", "default (a token from oauth_cb, or unsecured) or oidc (client credentials)"),
    Key("sasl.oauthbearer.token.endpoint.url", "the OIDC token endpoint"),
    Key("sasl.oauthbearer.client.id", "the OIDC client id", ("sasl.oauthbearer.client.credentials.client.id",)),
    Key("sasl.oauthbearer.client.secret", "the OIDC client secret",
        ("sasl.oauthbearer.client.credentials.client.secret",), secret=True),
    Key("sasl.oauthbearer.scope", "the scope asked of the token endpoint"),
    Key("sasl.oauthbearer.extensions", "SASL extensions sent with the token, key=value,..."),
    Key("sasl.oauthbearer.config", "the string passed to oauth_cb"),
    Key("oauth_cb", "confluent-kafka's token callback: oauth_cb(config) -> (token, expiry_epoch_seconds)"),
    Key("sasl.login.refresh.window.factor", "fraction of a token's lifetime after which it is renewed (0.8)"),
    Key("sasl.login.callback.handler.class", "Java's OAuthBearerLoginCallbackHandler (meaning: OIDC) only"),
    Key("sasl.client.callback.handler.class", "MSK's IAMClientCallbackHandler only (AWS_MSK_IAM)"),
    Key("sasl.kerberos.service.name", "the broker's Kerberos service name (kafka)"),
    Key("sasl.kerberos.principal", "the client's Kerberos principal"),
    Key("sasl.kerberos.keytab", "the client's keytab (sets KRB5_CLIENT_KTNAME)"),
    Key("ssl.ca.location", "PEM file of the CA certificates to trust"),
    Key("ssl.ca.pem", "PEM text of the CA certificates to trust", ("ssl.truststore.certificates",)),
    Key("ssl.truststore.location", "truststore file, PKCS12, JKS or PEM"),
    Key("ssl.truststore.password", "the truststore's password", secret=True),
    Key("ssl.truststore.type", "PKCS12, JKS or PEM (checked against the file)"),
    Key("ssl.certificate.location", "PEM file of the client certificate (chain)"),
    Key("ssl.certificate.pem", "PEM text of the client certificate (chain)", ("ssl.keystore.certificate.chain",)),
    Key("ssl.key.location", "PEM file of the client's private key"),
    Key("ssl.key.pem", "PEM text of the client's private key", ("ssl.keystore.key",), secret=True),
    Key("ssl.key.password", "the private key's passphrase", secret=True),
    Key("ssl.keystore.location", "keystore file with the client certificate and key, PKCS12, JKS or PEM"),
    Key("ssl.keystore.password", "the keystore's password", secret=True),
    Key("ssl.keystore.type", "PKCS12, JKS or PEM (checked against the file)"),
    Key("ssl.crl.location", "PEM file of certificate revocation lists checked for the broker's certificate"),
    Key("enable.ssl.certificate.verification", "false: do not verify the broker's certificate (tests only)"),
    Key("ssl.endpoint.identification.algorithm", "https (default): the certificate must name the host; none"),
    Key("ssl.enabled.protocols", "TLS versions allowed: TLSv1.2, TLSv1.3"),
    Key("ssl.protocol", "TLSv1.2 or TLSv1.3: the lowest TLS version allowed (TLS: TLSv1.2)"),
    Key("request.timeout.ms", "how long one request waits for its answer", ("socket.timeout.ms",)),
    Key("socket.connection.setup.timeout.ms", "how long one connection attempt may take"),
    Key("reconnect.backoff.ms", "first pause before reconnecting to a broker"),
    Key("reconnect.backoff.max.ms", "longest pause before reconnecting to a broker"),
    Key("connections.max.idle.ms", "idle connections are closed after this"),
    Key("metadata.max.age.ms", "cluster metadata is refreshed at least this often"),
    Key("client.dns.lookup", "use_all_dns_ips or resolve_canonical_bootstrap_servers_only"),
)
_PRODUCER = (
    Key("transactional.id", "the producer's transactional id (chosen by the Spark sink)"),
    Key("transaction.two.phase.commit.enable", "must agree with two_phase_commit"),
    Key("linger.ms", "how long records wait to fill a batch", ("queue.buffering.max.ms",)),
    Key("batch.size", "largest batch per partition in bytes"),
    Key("compression.type", "none, gzip, snappy, lz4 or zstd", ("compression.codec",)),
    Key("transaction.timeout.ms", "the broker aborts a transaction open longer (not when prepared under 2PC)"),
    Key("delivery.timeout.ms", "how long a record may take to be written, retries included",
        ("message.timeout.ms",)),
    Key("max.block.ms", "how long a call waits for metadata, a coordinator or buffer space"),
    Key("retry.backoff.ms", "the pause between retries"),
    Key("enable.idempotence", "must be true"),
    Key("acks", "must be all (or -1)", ("request.required.acks",)),
    Key("max.in.flight.requests.per.connection", "at most 5", ("max.in.flight",)),
    Key("max.request.size", "largest record batch request in bytes", ("message.max.bytes",)),
)
KEYS: tuple[Key, ...] = tuple(attrs.evolve(k, producer=True) for k in _PRODUCER) + _CONNECTION
PRODUCER_KEYS = frozenset(k.name for k in KEYS if k.producer)

#: keys users bring from other clients that kafka2pc does not honour, and why
#: consumer settings, found in the client snippets managed-Kafka providers hand out (Confluent Cloud's carries
#: session.timeout.ms): kafka2pc writes and never joins a group, so they are dropped with one INFO line, as
#: librdkafka's producer ignores them and Java's warns
CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "group.protocol", "group.remote.assignor", "session.timeout.ms",
    "heartbeat.interval.ms", "max.poll.interval.ms", "max.poll.records", "auto.offset.reset", "enable.auto.commit",
    "auto.commit.interval.ms", "enable.auto.offset.store", "isolation.level", "partition.assignment.strategy",
    "fetch.min.bytes", "fetch.max.bytes", "fetch.max.wait.ms", "fetch.wait.max.ms", "max.partition.fetch.bytes",
    "check.crcs", "exclude.internal.topics", "allow.auto.create.topics", "client.rack",
})
#: Schema Registry client settings (Confluent Cloud's client.properties carries them): kafka2pc takes bytes, so they
#: are dropped with one INFO line too (never their values: basic.auth.user.info holds a secret)
SCHEMA_REGISTRY_PREFIXES = ("schema.registry.", "basic.auth.", "bearer.auth.")
_dropped_consumer_keys: set[str] = set()

REFUSED: Mapping[str, str] = {
    "key.serializer": "records reach kafka2pc as bytes: serialize in the application (Spark's sink refuses it too)",
    "value.serializer": "records reach kafka2pc as bytes: serialize in the application (Spark's sink refuses it "
                        "too)",
    "retries": "kafka2pc retries until delivery.timeout.ms (as the Java client's default retries do): set that",
    "message.send.max.retries": "kafka2pc retries until delivery.timeout.ms: set that",
    "buffer.memory": "kafka2pc bounds what it holds by batch.size per partition and blocks up to max.block.ms",
    "queue.buffering.max.messages": "kafka2pc bounds what it holds by batch.size per partition",
    "queue.buffering.max.kbytes": "kafka2pc bounds what it holds by batch.size per partition",
    "partitioner.class": "the partition is chosen by the caller (or the Spark sink's partition column)",
    "partitioner": "the partition is chosen by the caller (or the Spark sink's partition column)",
    "interceptor.classes": "Java classes cannot run in kafka2pc",
    "metric.reporters": "kafka2pc's metrics are Prometheus collectors (kafka2pc.metrics)",
    "ssl.cipher.suites": "kafka2pc uses Python's OpenSSL defaults (TLS 1.2 and 1.3 ciphers)",
    "sasl.login.class": "Java classes cannot run in kafka2pc; pass oauth_cb for a custom token",
    "debug": "set the log level of the 'kafka2pc' and 'kafka' loggers instead",
    "error_cb": "errors are raised as kafka2pc exceptions",
    "stats_cb": "kafka2pc's metrics are Prometheus collectors (kafka2pc.metrics)",
}

_BY_NAME: Mapping[str, Key] = {k.name: k for k in KEYS} | {alias: k for k in KEYS for alias in k.aliases}
_SECRET_NAMES = frozenset(name for name, k in _BY_NAME.items() if k.secret)


def known_names() -> list[str]:
    """Every accepted name, aliases included."""
    return sorted(_BY_NAME)


def canonical(config: Mapping[str, object]) -> dict[str, object]:
    """``config`` with every key in kafka2pc's spelling, secrets wrapped, ``sasl.jaas.config`` expanded; a
    ConfigError for a refused, unknown or twice-given key."""
    out: dict[str, object] = {}
    given_as: dict[str, str] = {}
    for key, value in config.items():
        if key in CONSUMER_ONLY or key.startswith(SCHEMA_REGISTRY_PREFIXES):
            if key not in _dropped_consumer_keys:
                _dropped_consumer_keys.add(key)
                why = "a consumer setting" if key in CONSUMER_ONLY else "a Schema Registry setting (records are bytes)"
                log.info("ignoring %r: %s, and kafka2pc only writes", key, why)
            continue
        if key in REFUSED:
            raise ConfigError(key, f"is not honoured: {REFUSED[key]}")
        spec = _BY_NAME.get(key)
        if spec is None:
            raise ConfigError(key, unknown_key_problem(key))
        if spec.name in out and not _same(spec.name, out[spec.name], value):
            raise ConfigError(key, f"and {given_as[spec.name]} name the same setting with different values")
        out[spec.name] = _wrapped(spec, value)
        given_as[spec.name] = key
    if "sasl.jaas.config" in out:
        _expand_jaas(out)
    return out


def unknown_key_problem(key: str) -> str:
    """'unknown configuration key', with the nearest accepted name when it looks like a slip."""
    near = difflib.get_close_matches(key, list(_BY_NAME) + list(REFUSED) + list(CONSUMER_ONLY), n=1, cutoff=0.75)
    return "unknown configuration key" + (f"; did you mean {near[0]!r}?" if near else "")


def _same(name: str, one: object, other: object) -> bool:
    """Whether two values given for one setting under two names mean the same (5 and "5", True and "true", acks -1
    and all). Text is compared as written: a password or an id differing in case is another value."""
    def plain(value: object) -> str:
        if isinstance(value, Secret):
            return value.reveal()
        text = str(value).strip()
        if isinstance(value, bool) or name == "acks":
            text = text.lower()
        return "all" if name == "acks" and text == "-1" else text
    return plain(one) == plain(other)


def _wrapped(spec: Key, value: object) -> object:
    if spec.secret and isinstance(value, str):
        return Secret(value)
    return value


def is_secret(name: str) -> bool:
    """Whether the key's value must never be shown."""
    return name in _SECRET_NAMES


def redacted_repr(config: Mapping[str, object]) -> str:
    """A repr of ``config`` (keys as the user wrote them) with every secret value shown as ``***``."""
    return repr({key: "***" if is_secret(key) else value for key, value in config.items()})


# -- sasl.jaas.config ---------------------------------------------------------------------------------------------

_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_MSK = "software.amazon.msk.auth.iam.IAMLoginModule"
_KRB5 = "com.sun.security.auth.module.Krb5LoginModule"
#: the prefix of Kafka's classes as Databricks runtimes shade them (kafkashaded.org.apache.kafka...)
SHADED_PREFIX = "kafkashaded."
#: options of MSK's IAMLoginModule that kafka2pc does not read, and what to do instead
_MSK_OPTION_ADVICE = {
    "awsProfileName": "set the AWS_PROFILE environment variable on the driver and the executors instead "
                      "(credentials come from the standard AWS chain)",
    "awsRoleArn": "give the role through the standard AWS chain instead (a profile with role_arn in AWS_PROFILE, "
                  "or AWS_ROLE_ARN with a web identity token)",
}
#: jaas option -> kafka2pc key, per login module
_OPTIONS: Mapping[str, Mapping[str, str]] = {
    _PLAIN: {"username": "sasl.username", "password": "sasl.password"},
    _SCRAM: {"username": "sasl.username", "password": "sasl.password", "tokenauth": ""},
    _OAUTH: {"clientId": "sasl.oauthbearer.client.id", "clientSecret": "sasl.oauthbearer.client.secret",
             "scope": "sasl.oauthbearer.scope", "unsecuredLoginStringClaim_sub": "_unsecured.sub",
             "unsecuredLoginLifetimeSeconds": "_unsecured.lifetime.s"},
    _MSK: {},
    _KRB5: {"principal": "sasl.kerberos.principal", "keyTab": "sasl.kerberos.keytab",
            "serviceName": "sasl.kerberos.service.name", "useKeyTab": "", "storeKey": "", "useTicketCache": "",
            "doNotPrompt": "", "debug": ""},
}
_MECHANISMS: Mapping[str, tuple[str, ...]] = {
    _PLAIN: ("PLAIN",), _SCRAM: ("SCRAM-SHA-256", "SCRAM-SHA-512"), _OAUTH: ("OAUTHBEARER",),
    _MSK: ("AWS_MSK_IAM",), _KRB5: ("GSSAPI",),
}


def _expand_jaas(out: dict[str, object]) -> None:
    text = out.pop("sasl.jaas.config")
    module = jaas.parse(text.reveal() if isinstance(text, Secret) else str(text))
    class_name = module.class_name.removeprefix(SHADED_PREFIX)
    names = _OPTIONS.get(class_name)
    if names is None:
        raise ConfigError(jaas.KEY, f"login module {module.class_name!r} is not one kafka2pc reads; it reads "
                                    f"{', '.join(sorted(_OPTIONS))}")
    short = class_name.rsplit(".", 1)[-1]
    mechanisms = _MECHANISMS[class_name]
    mechanism = str(out.get("sasl.mechanism", "")).upper() or None
    if mechanism is None:
        if len(mechanisms) > 1:
            raise ConfigError("sasl.mechanism", f"is required with {short}: {' or '.join(mechanisms)}")
        out["sasl.mechanism"] = mechanisms[0]
    elif mechanism not in mechanisms:
        raise ConfigError(jaas.KEY, f"{short} serves {' or '.join(mechanisms)}, not sasl.mechanism={mechanism}")
    extensions = []
    for option, value in module.options.items():
        if class_name == _OAUTH and option.startswith("extension_") and len(option) > len("extension_"):
            extensions.append(f"{option.removeprefix('extension_')}={value}")  # as Java's login module sends them
            continue
        if option not in names:
            advice = _MSK_OPTION_ADVICE.get(option) if class_name == _MSK else None
            raise ConfigError(jaas.KEY, f"option {option!r} of {short} is not one kafka2pc reads ("
                                        f"{advice or ', '.join(sorted(names)) or 'it takes none'})")
        if option == "tokenauth" and str(value).strip().lower() == "true":
            raise ConfigError(jaas.KEY, "tokenauth=true (SCRAM with a delegation token) is not supported")
        target = names[option]
        if not target:
            continue
        wrapped = Secret(value) if is_secret(target) else value
        if target in out and out[target] != wrapped:
            raise ConfigError(jaas.KEY, f"option {option!r} contradicts {target}")
        out[target] = wrapped
    if extensions:
        if "sasl.oauthbearer.extensions" in out:
            raise ConfigError(jaas.KEY, "extension_* options and sasl.oauthbearer.extensions both given: use one")
        out["sasl.oauthbearer.extensions"] = ",".join(extensions)


def markdown_table() -> str:
    """docs/configuration.md's table of keys."""
    rows = ["| key | also accepted as | what it does |", "|---|---|---|"]
    for key in sorted(KEYS, key=lambda k: (k.producer, k.name)):
        aliases = ", ".join(f"`{a}`" for a in key.aliases if a != key.name)
        secret = " (secret: never logged)" if key.secret else ""
        rows.append(f"| `{key.name}` | {aliases} | {key.meaning}{secret} |")
    return "\n".join(rows) + "\n"
