"""sasl.jaas.config: read into kafka2pc's keys, never evaluated; secrets never echoed in errors."""

import pytest

from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc.config import ClientConfig, jaas
from kafka2pc.config.oauth import TokenSource
from kafka2pc.errors import ConfigError

BASE = {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL"}
PLAIN = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="s3cr\\"et";'
SCRAM = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="pw-123";'


def test_plain_login_module_gives_user_password_and_mechanism():
    kwargs = kafka_python_kwargs(ClientConfig.from_dict({**BASE, "sasl.jaas.config": PLAIN}))
    assert (kwargs["sasl_mechanism"], kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == \
        ("PLAIN", "alice", 's3cr"et')


def test_scram_login_module_needs_the_mechanism_named():
    with pytest.raises(ConfigError, match="SCRAM-SHA-256 or SCRAM-SHA-512") as info:
        ClientConfig.from_dict({**BASE, "sasl.jaas.config": SCRAM})
    assert info.value.key == "sasl.mechanism"
    config = ClientConfig.from_dict({**BASE, "sasl.jaas.config": SCRAM, "sasl.mechanism": "SCRAM-SHA-256"})
    assert config.options["sasl_plain_username"] == "alice"


def test_a_module_for_another_mechanism_is_an_error():
    with pytest.raises(ConfigError, match=r"PlainLoginModule serves PLAIN, not sasl\.mechanism=SCRAM-SHA-512"):
        ClientConfig.from_dict({**BASE, "sasl.jaas.config": PLAIN, "sasl.mechanism": "SCRAM-SHA-512"})


def test_oauthbearer_module_with_client_credentials_means_oidc():
    config = ClientConfig.from_dict({
        **BASE, "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                            'clientId="svc" clientSecret="cs-9876" scope="kafka";'})
    assert config.oauth is not None
    assert (config.oauth.source, config.oauth.client_id, config.oauth.scope) == (TokenSource.OIDC, "svc", "kafka")
    assert config.oauth.client_secret is not None and config.oauth.client_secret.reveal() == "cs-9876"


def test_oauthbearer_module_unsecured_for_test_brokers():
    config = ClientConfig.from_dict({
        **BASE, "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                                    'unsecuredLoginStringClaim_sub="alice";'})
    assert config.oauth is not None and config.oauth.source is TokenSource.UNSECURED
    assert config.options["sasl_mechanism"] == "OAUTHBEARER"


def test_msk_iam_module():
    config = ClientConfig.from_dict({
        **BASE, "sasl.mechanism": "AWS_MSK_IAM",
        "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler"})
    assert config.options["sasl_mechanism"] == "AWS_MSK_IAM"


def test_msk_profile_option_is_not_read_and_the_message_says_what_to_do():
    with pytest.raises(ConfigError, match="option 'awsProfileName' of IAMLoginModule is not one kafka2pc reads "
                                          r"\(set the AWS_PROFILE environment variable"):
        ClientConfig.from_dict({**BASE, "sasl.jaas.config": 'software.amazon.msk.auth.iam.IAMLoginModule required '
                                                            'awsProfileName="p";'})


def test_oauthbearer_extension_options_are_sasl_extensions():
    """Confluent Cloud's Java snippet: extension_logicalCluster and extension_identityPoolId."""
    config = ClientConfig.from_dict({
        **BASE, "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                            'clientId="cid" clientSecret="cs-1234" scope="kafka" extension_logicalCluster="lkc-1" '
                            'extension_identityPoolId="pool-1";'})
    assert config.oauth is not None
    assert config.oauth.extensions == (("logicalCluster", "lkc-1"), ("identityPoolId", "pool-1"))


def test_databricks_shaded_login_modules_are_read_as_kafkas():
    config = ClientConfig.from_dict({**BASE, "sasl.jaas.config": "kafkashaded." + PLAIN})
    assert config.options["sasl_mechanism"] == "PLAIN" and config.options["sasl_plain_username"] == "alice"


def test_scram_with_a_delegation_token_is_refused():
    with pytest.raises(ConfigError, match="delegation token"):
        ClientConfig.from_dict({**BASE, "sasl.mechanism": "SCRAM-SHA-256",
                                "sasl.jaas.config": SCRAM.replace(";", ' tokenauth="true";')})


def test_kerberos_module_needs_the_gssapi_extra_or_gives_its_keys():
    text = ('com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true '
            'keyTab="/etc/k.keytab" principal="app@EXAMPLE.COM" serviceName="kafka";')
    try:
        import gssapi  # noqa: F401, PLC0415
    except ImportError:
        with pytest.raises(ConfigError, match=r"kafka2pc\[gssapi\]"):
            ClientConfig.from_dict({**BASE, "sasl.jaas.config": text})
        return
    config = ClientConfig.from_dict({**BASE, "sasl.jaas.config": text})
    assert config.options["sasl_kerberos_name"] == "app@EXAMPLE.COM" and config.kerberos_keytab == "/etc/k.keytab"



@pytest.mark.parametrize(("text", "fragment"), [
    ("org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\" password=\"hunter22\"",
     "must end with ';'"),
    ("PlainLoginModule", "expected '<LoginModule class> required"),
    ('x.Y required a="1"; x.Z required b="2";', "more than one login module"),
    ('x.Y required a=;', "option=value pairs"),
    ('org.apache.kafka.common.security.plain.PlainLoginModule required user="a" password="hunter22";',
     "option 'user' of PlainLoginModule"),
    ('com.example.Custom required secret="hunter22";', "is not one kafka2pc reads"),
])
def test_malformed_or_unknown_modules_are_named_without_their_values(text, fragment):
    with pytest.raises(ConfigError) as info:
        ClientConfig.from_dict({**BASE, "sasl.mechanism": "PLAIN", "sasl.jaas.config": text})
    assert fragment in str(info.value) and "hunter22" not in str(info.value)


def test_quoted_values_keep_semicolons_and_escapes():
    module = jaas.parse('a.B required x="1;2" y="q\\\\z" z=bare;')
    assert dict(module.options) == {"x": "1;2", "y": "q\\z", "z": "bare"}


def test_single_quoted_values_as_javas_tokenizer_reads_them():
    module = jaas.parse("a.B required username='alice' password='p;w\"x' other=\"it's\";")
    assert dict(module.options) == {"username": "alice", "password": 'p;w"x', "other": "it's"}
    single = SCRAM.replace('"', "'")
    config = ClientConfig.from_dict({**BASE, "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": single})
    assert kafka_python_kwargs(config)["sasl_plain_password"] == "pw-123"
