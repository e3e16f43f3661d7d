"""`DIGEST_DKIM_*`: all three or none, a readable key, a domain aligned with the sender's."""

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from digest_pipeline.dkim_settings import MAX_KEY_BYTES, DkimSettings
from digest_pipeline.settings import InvalidSetting, load_settings

ROOT = Path("/srv/shop")
SMTP = {
    "DIGEST_MAILER": "smtp",
    "DIGEST_SMTP_HOST": "relay.internal",
    "DIGEST_FROM_ADDRESS": "Shop <digest@news.shop.example>",
}


def _pem(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def rsa_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dkim") / "rsa.pem"
    path.write_bytes(_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    return path


def dkim_env(key_file: Path, **overrides: str) -> dict[str, str]:
    env = SMTP | {"DIGEST_DKIM_KEY_FILE": str(key_file), "DIGEST_DKIM_SELECTOR": "digest2026"}
    return env | overrides


def signing(env: dict[str, str]) -> DkimSettings:
    smtp = load_settings(env, ROOT).smtp
    assert smtp is not None
    assert smtp.dkim is not None
    return smtp.dkim


def test_no_dkim_variable_means_unsigned():
    smtp = load_settings(SMTP, ROOT).smtp
    assert smtp is not None
    assert smtp.dkim is None


def test_the_domain_defaults_to_the_senders(rsa_key_file):
    dkim = signing(dkim_env(rsa_key_file))
    assert (dkim.selector, dkim.domain) == ("digest2026", "news.shop.example")
    assert dkim.algorithm == b"rsa-sha256"
    assert dkim.private_key.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    assert "PRIVATE" not in repr(load_settings(dkim_env(rsa_key_file), ROOT))


@pytest.mark.parametrize("domain", ["news.shop.example", "shop.example", "SHOP.example."])
def test_the_senders_domain_or_a_parent_is_aligned(rsa_key_file, domain):
    dkim = signing(dkim_env(rsa_key_file, DIGEST_DKIM_DOMAIN=domain))
    assert dkim.domain == domain.lower().rstrip(".")


def test_an_ed25519_key_signs_ed25519_sha256(tmp_path):
    key = ed25519.Ed25519PrivateKey.generate()
    (path := tmp_path / "ed.pem").write_bytes(_pem(key))
    dkim = signing(dkim_env(path))
    seed = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    assert (dkim.algorithm, dkim.private_key) == (
        b"ed25519-sha256",
        base64.b64encode(seed),
    )


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("DIGEST_DKIM_KEY_FILE", "DIGEST_DKIM_KEY_FILE"),
        ("DIGEST_DKIM_SELECTOR", "DIGEST_DKIM_SELECTOR"),
    ],
)
def test_a_partial_set_is_refused_naming_what_is_missing(rsa_key_file, drop, named):
    env = dkim_env(rsa_key_file)
    del env[drop]
    with pytest.raises(InvalidSetting, match=f"^{named} required"):
        load_settings(env, ROOT)


def test_a_domain_alone_is_refused():
    env = SMTP | {"DIGEST_DKIM_DOMAIN": "shop.example"}
    with pytest.raises(InvalidSetting, match="DIGEST_DKIM_KEY_FILE and DIGEST_DKIM_SELECTOR"):
        load_settings(env, ROOT)


@pytest.mark.parametrize(
    "domain",
    [
        "other.example",  # not the sender's organisation at all
        "hop.example",  # a suffix of the text, not a parent domain
        "mail.news.shop.example",  # a child of the sender's domain does not align
        "example",  # a bare top-level domain
    ],
)
def test_a_domain_not_aligned_with_the_sender_is_refused(rsa_key_file, domain):
    with pytest.raises(InvalidSetting, match=r"^DIGEST_DKIM_DOMAIN=.*DMARC alignment"):
        load_settings(dkim_env(rsa_key_file, DIGEST_DKIM_DOMAIN=domain), ROOT)


def test_a_bad_selector_is_refused(rsa_key_file):
    with pytest.raises(InvalidSetting, match=r"^DIGEST_DKIM_SELECTOR="):
        load_settings(dkim_env(rsa_key_file, DIGEST_DKIM_SELECTOR="a b;c"), ROOT)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: d / "absent.pem", "cannot be read"),
        (lambda d: d, "cannot be read"),  # a directory
        (lambda d: _write(d / "junk.pem", b"not a key\n"), "not an unencrypted PEM private key"),
        (
            lambda d: _write(d / "big.pem", b"#" * (MAX_KEY_BYTES + 1)),
            "larger than 64 KiB",
        ),
        (
            lambda d: _write(
                d / "locked.pem",
                rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.BestAvailableEncryption(b"pass"),
                ),
            ),
            "not an unencrypted PEM private key",
        ),
    ],
)
def test_an_unusable_key_file_is_refused_naming_the_variable(tmp_path, make, reason):
    with pytest.raises(InvalidSetting, match=f"^DIGEST_DKIM_KEY_FILE=.*{reason}") as caught:
        load_settings(dkim_env(make(tmp_path)), ROOT)
    assert "\n" not in str(caught.value)
