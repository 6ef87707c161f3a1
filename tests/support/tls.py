"""TLS for the tests: the throwaway CA (it lives in :mod:`chatlab.throwaway_ca`, which the
lab uses too) and the Chromium flag that trusts a certificate it signed."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from chatlab.throwaway_ca import ThrowawayCA, make_ca

__all__ = ["ThrowawayCA", "make_ca", "trusted_by_chromium"]


def trusted_by_chromium(cert_file: Path) -> str:
    """The Chromium flag that accepts ``cert_file``'s key whoever signed it (the base64
    SHA-256 of its SubjectPublicKeyInfo): the page over https from a throwaway CA."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    return f"--ignore-certificate-errors-spki-list={digest}"
