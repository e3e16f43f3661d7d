"""Keys and signatures made as SendGrid makes them: ECDSA P-256 over `timestamp + body`."""

import base64

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def verification_key_text(private: ec.EllipticCurvePrivateKey) -> str:
    """What SendGrid's settings page shows: the base64 DER SubjectPublicKeyInfo."""
    der = private.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


def sign(private: ec.EllipticCurvePrivateKey, timestamp: str, body: bytes) -> str:
    """The signature header SendGrid sends: base64 DER ECDSA over `timestamp + body`."""
    der = private.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return base64.b64encode(der).decode()


PRIVATE = new_key()
OTHER = new_key()
PUBLIC_TEXT = verification_key_text(PRIVATE)
