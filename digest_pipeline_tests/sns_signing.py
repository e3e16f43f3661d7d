"""SNS messages signed here as AWS signs them, and a loopback HTTPS server for their certificate.

The string to sign follows AWS's "Verifying the signatures of Amazon SNS messages": for a
Notification `Message`, `MessageId`, `Subject` (only when present), `Timestamp`, `TopicArn`,
`Type`; for a confirmation `Message`, `MessageId`, `SubscribeURL`, `Timestamp`, `Token`,
`TopicArn`, `Type`; each as its name, a newline, its value, a newline. It is written here from
that page, not imported from the product. `LoopbackHttps` is a real TLS server on 127.0.0.1 with
a certificate from a throwaway CA: it serves signing certificates and records every GET (the
certificate fetches and the subscribe URL confirmations), so a test can assert what was fetched.
`AWS_SIGNED` are two messages AWS itself signed, with the certificate they were signed under.
"""

import base64
import functools
import ipaddress
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
TOPIC = "arn:aws:sns:eu-west-1:123456789012:digest-ses-events"
OTHER_TOPIC = "arn:aws:sns:eu-west-1:210987654321:someone-elses-topic"
CERT_PATH = "/SimpleNotificationService-0123456789abcdef.pem"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass(frozen=True)
class SigningIdentity:
    """A key SNS would sign with and the certificate it would publish for it."""

    key: rsa.RSAPrivateKey
    cert_pem: bytes


def signing_identity(
    not_before: datetime = datetime(2020, 1, 1, tzinfo=UTC),
    not_after: datetime = datetime(2040, 1, 1, tzinfo=UTC),
) -> SigningIdentity:
    """A fresh RSA key and its self-signed certificate, valid from `not_before` to `not_after`."""
    key = new_rsa()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("sns.amazonaws.com"))
        .issuer_name(_name("sns.amazonaws.com"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    return SigningIdentity(key, cert.public_bytes(serialization.Encoding.PEM))


def string_to_sign(message: dict[str, Any]) -> bytes:
    """AWS's string to sign for `message` (its `Type` picks the fields)."""
    names = NOTIFICATION_FIELDS if message["Type"] == "Notification" else CONFIRMATION_FIELDS
    text = ""
    for name in names:
        if name in message:
            text += name + "\n" + message[name] + "\n"
    return text.encode("utf-8")


def sign(message: dict[str, Any], key: rsa.RSAPrivateKey, version: str = "2") -> dict[str, Any]:
    """`message` with `SignatureVersion` and the base64 `Signature` AWS would send."""
    digest = hashes.SHA1() if version == "1" else hashes.SHA256()
    raw = key.sign(string_to_sign(message), padding.PKCS1v15(), digest)
    return {**message, "SignatureVersion": version, "Signature": base64.b64encode(raw).decode()}


def sns_timestamp(at: datetime) -> str:
    """SNS's spelling of a time: milliseconds and `Z`."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


@dataclass
class _Answers:
    """What the server answers per path, and every GET it received (path with query)."""

    files: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    gets: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    answers: _Answers

    def do_GET(self) -> None:
        with self.answers.lock:
            self.answers.gets.append(self.path)
            status, body = self.answers.files.get(self.path.split("?", 1)[0], (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test asserts on `gets`, not on stderr


@functools.cache
def _test_ca_and_server_cert() -> tuple[bytes, bytes, bytes]:
    """A throwaway CA's PEM, and a server certificate (PEM) and key (PEM) for 127.0.0.1.

    Made once per test process: TLS checks them against the real time, so they are valid from
    a day before it to two days after.
    """
    now = datetime.now(UTC)
    ca_key, server_key = new_rsa(), new_rsa()
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("digest test CA"))
        .issuer_name(_name("digest test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return (
        ca.public_bytes(serialization.Encoding.PEM),
        server.public_bytes(serialization.Encoding.PEM),
        key_pem,
    )


@dataclass
class LoopbackHttps:
    """A running HTTPS server on 127.0.0.1 and what a client needs to trust it."""

    port: int
    #: trusts the test CA only: what the product's fetcher is given as `verify`
    client_context: ssl.SSLContext
    _answers: _Answers

    @property
    def host_pattern(self) -> str:
        """A certificate host pattern that admits this server (its host and port)."""
        return rf"127\.0\.0\.1:{self.port}"

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, body: bytes, status: int = 200) -> str:
        """Answers GETs of `path` with `status` and `body`; returns its URL."""
        with self._answers.lock:
            self._answers.files[path] = (status, body)
        return self.url(path)

    @property
    def gets(self) -> list[str]:
        """Every path (with its query) GET so far, in order."""
        with self._answers.lock:
            return list(self._answers.gets)


def loopback_server_context() -> ssl.SSLContext:
    """A TLS server context for 127.0.0.1 whose certificate `loopback_ca_pem`'s CA issued."""
    _, cert_pem, key_pem = _test_ca_and_server_cert()
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder, "server.pem"), Path(folder, "server.key")
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
    return context


@contextmanager
def loopback_https() -> Iterator[LoopbackHttps]:
    """An HTTPS server on a free port of 127.0.0.1, with a certificate from a fresh test CA."""
    ca_pem = _test_ca_and_server_cert()[0]
    answers = _Answers()
    handler = type("Handler", (_Handler,), {"answers": answers})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.socket = loopback_server_context().wrap_socket(httpd.socket, server_side=True)
    # a short poll interval: `shutdown` waits for the loop's next look at its flag
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        client_context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
        yield LoopbackHttps(httpd.server_address[1], client_context, answers)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def loopback_ca_pem() -> bytes:
    """The PEM of the CA that issued `loopback_https`'s certificates: what a client must trust."""
    return _test_ca_and_server_cert()[0]


# Two messages AWS itself signed, and the certificate AWS published for them (CN
# sns.amazonaws.com, issued by Amazon's Server CA 1B, valid 2021-09-07 to 2022-08-17), as the
# AWS SDK for Ruby's own tests hold them: aws/aws-sdk-ruby,
# gems/aws-sdk-sns/spec/message_verifier_spec.rb (commit 039d3fec425fa6d8a330619a3caf1ba0fa1aede9).
# The certificate is served from the loopback server here: `SigningCertURL` is not signed.
AWS_CERT_PEM = b"""-----BEGIN CERTIFICATE-----
MIIF1zCCBL+gAwIBAgIQB9pYWG3Mi7xej22g9pobJTANBgkqhkiG9w0BAQsFADBG
MQswCQYDVQQGEwJVUzEPMA0GA1UEChMGQW1hem9uMRUwEwYDVQQLEwxTZXJ2ZXIg
Q0EgMUIxDzANBgNVBAMTBkFtYXpvbjAeFw0yMTA5MDcwMDAwMDBaFw0yMjA4MTcy
MzU5NTlaMBwxGjAYBgNVBAMTEXNucy5hbWF6b25hd3MuY29tMIIBIjANBgkqhkiG
9w0BAQEFAAOCAQ8AMIIBCgKCAQEAutFqueT3XgP13udzxE6UpbdjOtVO5DwoMpSM
iDNMnGzF1TYH5/R2LPUOBeTB0SkKnR4kpNcUZhicpGD4aKciz/GEZ6wu65xncfT9
H/KBOQwoXYTuClHwp6fYpGzcGFaFoEYMnijL/o4qmTSd+ukglQUgKpsDw4ofw6rU
m2CttJo+GQSNQ9NfGR1h/0J+zsApkeSYrXRx5wNlu87z8os1C/6PBrUHwt3xXeaf
Xzfwut8aRRYsS8BySOA9DAgLfNHlfdQCjKPXKrG/ussgReyWD6n/HH+j7Uha3xos
TzQqJifcxlTq6MxWdPR6fDaJNvqw6DOE7UjUNxHguXHlVfxhlQIDAQABo4IC6TCC
AuUwHwYDVR0jBBgwFoAUWaRmBlKge5WSPKOUByeWdFv5PdAwHQYDVR0OBBYEFAqz
C+vyouneE7mWWLbi9i0UsWUbMBwGA1UdEQQVMBOCEXNucy5hbWF6b25hd3MuY29t
MA4GA1UdDwEB/wQEAwIFoDAdBgNVHSUEFjAUBggrBgEFBQcDAQYIKwYBBQUHAwIw
OwYDVR0fBDQwMjAwoC6gLIYqaHR0cDovL2NybC5zY2ExYi5hbWF6b250cnVzdC5j
b20vc2NhMWIuY3JsMBMGA1UdIAQMMAowCAYGZ4EMAQIBMHUGCCsGAQUFBwEBBGkw
ZzAtBggrBgEFBQcwAYYhaHR0cDovL29jc3Auc2NhMWIuYW1hem9udHJ1c3QuY29t
MDYGCCsGAQUFBzAChipodHRwOi8vY3J0LnNjYTFiLmFtYXpvbnRydXN0LmNvbS9z
Y2ExYi5jcnQwDAYDVR0TAQH/BAIwADCCAX0GCisGAQQB1nkCBAIEggFtBIIBaQFn
AHYAKXm+8J45OSHwVnOfY6V35b5XfZxgCvj5TV0mXCVdx4QAAAF7vfDVkQAABAMA
RzBFAiEA2XfHuy36aqRFiaL8c3md2mH451go8707+fRE0pEdSRACIE/g5FXTUXUZ
PFcmOhm9TZ+uMY1i4CIQ/CKVWln6C3t+AHYAUaOw9f0BeZxWbbg3eI8MpHrMGyfL
956IQpoN/tSLBeUAAAF7vfDVjAAABAMARzBFAiBF1MhhFP0+FQt3daDFfMYoWwnr
muTInrjNpwfzlvQBugIhAPYadFzr+LaxSJoiZEbEHBvTts7bT0M3eCQONA2O7w6n
AHUAQcjKsd8iRkoQxqE6CUKHXk4xixsD6+tLx2jwkGKWBvYAAAF7vfDVdAAABAMA
RjBEAiAtPapmFAuA71ih4NoSd5hJelzAltNQpxDMcDfDyHyU8gIgWxmaa6+2KbBu
9xdv379zvnJACFR7jc+4asl08Dn4aagwDQYJKoZIhvcNAQELBQADggEBAA54QX0u
oFWXfMmv02CGZv4NWo5TapyeeixQ2kKpZHRdVZjxZrw+hoF6HD7P3kGjH8ztyJll
tDxB0qgMltbPhQdScwhA6iTgoaBYqEUC/VHKd4PmmPT6yIsM36NBZVmkGlzl5uNo
/dBgBaG0SsVJnhr5zro3c2quC7n6fVGEZhf/UgQwRnnvThnvbNKguglDMq4uEqv8
njKyleht+glkcmXO0m9qLKt6BOS0amy6U2GlAwRn0Wx02ndJtnRCSC6kPuRWK/SQ
FEjB7gCK4hdKaAOuWdZpI55vF6ifOeM8toC3g7ofO8qLTnJupAG+ZitY5J3cvHWr
HqOUdKigPDHYLRo=
-----END CERTIFICATE-----
"""
AWS_TOPIC_1 = (
    "arn:aws:sns:us-east-2:295079676684:publish-and-verify-892f85fe-4836-424d-8188-ab85bef0f362"
)
AWS_TOPIC_2 = (
    "arn:aws:sns:us-east-2:295079676684:publish-and-verify-62674b1d-4295-426b-88e7-5fb75652a04e"
)
AWS_SIGNED = [
    {
        "Type": "Notification",
        "MessageId": "792cda85-518f-5dd3-9163-81d851212f3a",
        "TopicArn": AWS_TOPIC_1,
        "Message": "Hello world",
        "Timestamp": "2022-07-28T21:23:58.317Z",
        "SignatureVersion": "1",
        "Signature": (
            "ghtf+deOBAzHJJZ6s6CdRLfTQAlcGzq9naoFM1wi0CJiq//uVRuZnamrkWNF0fhouMFvuLVRwcz8PZLUMSfn"
            "md5VpdTKpTyiKmy1qJAZXma0w+yi7G+I33hD1Jyk1Nbym2n0kqp3fVu2aoooiN2ZeLAT2bH0/BtjLSfN1yAO"
            "KNoprco4qV9gGUZinXJdj9a1YdNhDR2jKi33ldlsVtEXAtiaDklGEk7DgRKX38GerBPiLg3FdtgY6KC7cdeG"
            "pU/dGK+4hjc83Ive1HoFkAwqhpgInM2sMytBosoiXfCmOKmU4xeGD0gHDNZTlJUJQDlzw8Eag0H9f/5zXF9d"
            "3uy0YQ=="
        ),
        "SigningCertURL": (
            "https://sns.us-east-2.amazonaws.com/"
            "SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"
        ),
    },
    {
        "Type": "Notification",
        "MessageId": "17dea24b-55c2-540b-8362-f916557af765",
        "TopicArn": AWS_TOPIC_2,
        "Message": "Hello world",
        "Timestamp": "2022-07-28T21:24:08.324Z",
        "SignatureVersion": "2",
        "Signature": (
            "CXVqp9PfZAL+4JHS3Zxo1PFbQsvnOjvmYhtIf17TWpwc+iIVas8kZ8GopuzVzVMdatE7rCl/O4P91Zp05Dwz"
            "8lk8dLhfp8gSu3Njlzxlyrmzo9x3va3Jb7zFnedgS2GKnZWHGBdwTXho+TosNUE+3e10OMSlwN5XGDwX7+R3"
            "WL+rn+AXmFAqp3alg27sYa55h1dLE9cGszGPjScPdtF3BmZsUDMx9wSdNKsCk+vSvE8yBjnCmUl7laSFj3Lz"
            "PVrlSwgNYCF3kYnNAkah7NplK4SFhJYLwS0HCVCQJKa8rVbQLf9cBTu60U402mrgy0bN8xWoyimzbYbrOMJj"
            "alqkUg=="
        ),
        "SigningCertURL": (
            "https://sns.us-east-2.amazonaws.com/"
            "SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"
        ),
    },
]
