"""The ``kid`` of an Ed25519 public key, computed the same way by the issuer and the verifier."""

from __future__ import annotations

import base64
import hashlib

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def key_id(public_key: Ed25519PublicKey) -> str:
    """base64url (unpadded) of the first 8 bytes of SHA-256 of the raw public key."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:8]).rstrip(b"=").decode()
