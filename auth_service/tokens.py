"""Signing keys on disk, the keyring, token issuance and the JWK set.

:class:`TokenIssuer` signs with a :class:`KeySource`: :class:`FileKeys` here (one
replica, ``AUTH_DB_URL`` empty), or the keyring every replica shares in PostgreSQL
(:mod:`auth_service.keys_postgres`). Files (paths from the settings):

``JWT_PRIVATE_KEY``
    The one signing key, Ed25519, PEM, mode 0600. Created on first start; a file
    whose mode lets group or others in stops the service (exit 2). Rotation
    replaces it, so old private keys are gone.
``JWT_PUBLIC_KEY``
    The signing key's public PEM, rewritten whenever it differs: the file the chat
    server verifies with when it does not use the JWK set.
``JWT_KEYRING``
    JSON listing every public key still served: ``kid``, ``public_key`` (a PEM file
    name beside the keyring, ``jwt_public.<kid>.pem``), ``created_at`` and
    ``retired_at`` (unix seconds; null for the signing key). A retired key stays in
    the JWK set until every token it signed has expired (``TOKEN_TTL_S`` after its
    retirement, plus a minute for clock skew), then is pruned.

A key's ``kid`` is base64url of the first 8 bytes of SHA-256 of its raw public key:
stable across restarts and the same wherever it is computed. Key material is never
logged. :func:`rotate_key` writes the new public PEM, then the private key, then the
keyring, each by atomic rename; a running service notices the keyring's change
(:meth:`FileKeys.refresh`, at most once a second) and signs with the new key.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auth_service.settings import SettingError, Settings
from chatlab.keys import key_id

log = logging.getLogger("auth_service.tokens")

ALGORITHM: Final = "EdDSA"
#: how long past its last token's expiry a retired key is still served (clock skew)
RETIRED_KEY_LEEWAY_S: Final = 60
#: the least time between two looks at the keyring file
REFRESH_INTERVAL_S: Final = 1.0


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    """The key as a SubjectPublicKeyInfo PEM (what the chat server loads)."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class KeyFiles:
    """Where the keys live on disk."""

    private_key: Path
    public_key: Path
    keyring: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyFiles:
        """The paths named by ``JWT_PRIVATE_KEY``, ``JWT_PUBLIC_KEY`` and ``JWT_KEYRING``."""
        return cls(
            Path(settings.jwt_private_key),
            Path(settings.jwt_public_key),
            Path(settings.jwt_keyring),
        )

    def archived_public_key(self, kid: str) -> Path:
        """The public PEM of key ``kid``, kept beside the keyring."""
        return self.keyring.parent / f"jwt_public.{kid}.pem"


@dataclass(frozen=True)
class PublicKey:
    """One public key of the keyring; ``retired_at`` is None for the signing key."""

    kid: str
    key: Ed25519PublicKey
    retired_at: int | None

    def jwk(self) -> dict[str, str]:
        """The key as a JWK with ``kid``, ``alg`` and ``use``."""
        jwk: dict[str, str] = jwt.algorithms.OKPAlgorithm.to_jwk(self.key, as_dict=True)
        return {**jwk, "kid": self.kid, "alg": ALGORITHM, "use": "sig"}


@dataclass(frozen=True)
class Keyring:
    """The signing key and every public key still served (the signing key's first)."""

    kid: str
    private_key: Ed25519PrivateKey
    public_keys: tuple[PublicKey, ...]

    def served(self, now_s: float, ttl_s: int) -> tuple[PublicKey, ...]:
        """The keys a token issued by this service may still carry at ``now_s``."""
        return tuple(key for key in self.public_keys if not _expired(key.retired_at, now_s, ttl_s))


# ---- on disk ---------------------------------------------------------------------------


def load_or_create_keys(files: KeyFiles, ttl_s: int, now_s: float | None = None) -> Keyring:
    """Load the keys, creating the signing key on first start; bad files are SettingErrors.

    Afterwards the keyring lists the signing key as the one not retired, every public
    PEM it names exists, and ``JWT_PUBLIC_KEY`` holds the signing key's public key.
    """
    now = int(time.time() if now_s is None else now_s)
    private_key = read_private_key(files.private_key)
    if private_key is None:
        private_key = Ed25519PrivateKey.generate()
        _write_private_key(files.private_key, private_key)
        log.info(
            "created signing key %s at %s", key_id(private_key.public_key()), files.private_key
        )
    kid = key_id(private_key.public_key())
    entries = _read_entries(files)
    changed = _make_active(entries, kid, now)
    _write_if_changed("JWT_KEYRING", files.archived_public_key(kid), private_key.public_key())
    changed = _prune(files, entries, now, ttl_s) or changed
    if changed:
        _write_entries(files, entries)
    _write_if_changed("JWT_PUBLIC_KEY", files.public_key, private_key.public_key())
    return _keyring(files, private_key, entries)


def rotate_key(
    files: KeyFiles, ttl_s: int, now_s: float | None = None, *, revoke: bool = False
) -> tuple[Keyring, str]:
    """Make a new signing key; the old one's public key stays served. Returns (keyring, old kid).

    ``revoke``: every older key leaves the keyring at once (a leaked key): tokens they
    signed stop verifying wherever the JWK set is refreshed.
    """
    now = int(time.time() if now_s is None else now_s)
    old = load_or_create_keys(files, ttl_s, now)
    private_key = Ed25519PrivateKey.generate()
    kid = key_id(private_key.public_key())
    _write_if_changed("JWT_KEYRING", files.archived_public_key(kid), private_key.public_key())
    _write_private_key(files.private_key, private_key)
    entries = _read_entries(files)
    _make_active(entries, kid, now)
    _prune(files, entries, now, ttl_s)
    if revoke:
        for entry in [e for e in entries if e["kid"] != kid]:
            entries.remove(entry)
            with suppress(FileNotFoundError):
                (files.keyring.parent / entry["public_key"]).unlink()
    _write_entries(files, entries)
    _write_if_changed("JWT_PUBLIC_KEY", files.public_key, private_key.public_key())
    return _keyring(files, private_key, entries), old.kid


def read_keys(files: KeyFiles) -> Keyring:
    """Read the keys as they are, writing nothing; SettingError if they do not agree."""
    private_key = read_private_key(files.private_key)
    if private_key is None:
        raise SettingError("JWT_PRIVATE_KEY", str(files.private_key), "the file is missing")
    kid = key_id(private_key.public_key())
    entries = _read_entries(files)
    if not any(e["kid"] == kid and e["retired_at"] is None for e in entries):
        raise SettingError(
            "JWT_KEYRING", str(files.keyring), f"its signing key is not {kid} (JWT_PRIVATE_KEY's)"
        )
    return _keyring(files, private_key, entries)


def _expired(retired_at: int | None, now_s: float, ttl_s: int) -> bool:
    return retired_at is not None and retired_at + ttl_s + RETIRED_KEY_LEEWAY_S <= now_s


def _make_active(entries: list[dict[str, Any]], kid: str, now: int) -> bool:
    """Retire every key but ``kid``, which becomes (or stays) the signing key; True if changed."""
    changed = False
    for entry in entries:
        if entry["kid"] != kid and entry["retired_at"] is None:
            entry["retired_at"] = now
            changed = True
        elif entry["kid"] == kid and entry["retired_at"] is not None:
            entry["retired_at"] = None
            changed = True
    if not any(entry["kid"] == kid for entry in entries):
        entries.append(
            {
                "kid": kid,
                "public_key": f"jwt_public.{kid}.pem",
                "created_at": now,
                "retired_at": None,
            }
        )
        changed = True
    return changed


def _prune(files: KeyFiles, entries: list[dict[str, Any]], now: int, ttl_s: int) -> bool:
    """Drop the keys no live token can carry, and their PEM files; True if any went."""
    expired = [e for e in entries if _expired(e["retired_at"], now, ttl_s)]
    for entry in expired:
        entries.remove(entry)
        with suppress(FileNotFoundError):
            (files.keyring.parent / entry["public_key"]).unlink()
        log.info("key %s expired: no longer in the JWK set", entry["kid"])
    return bool(expired)


def _keyring(
    files: KeyFiles, private_key: Ed25519PrivateKey, entries: list[dict[str, Any]]
) -> Keyring:
    kid = key_id(private_key.public_key())
    keys = [PublicKey(kid, private_key.public_key(), None)]
    for entry in entries:
        if entry["kid"] == kid:
            continue
        path = files.keyring.parent / entry["public_key"]
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("retired key %s left out of the JWK set: %s: %s", entry["kid"], path, exc)
            continue
        if isinstance(key, Ed25519PublicKey):
            keys.append(PublicKey(entry["kid"], key, entry["retired_at"]))
    return Keyring(kid, private_key, tuple(keys))


def read_private_key(path: Path) -> Ed25519PrivateKey | None:
    """The Ed25519 key in ``path`` (None when there is no file); SettingError when unusable."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SettingError(
            "JWT_PRIVATE_KEY", str(path), f"cannot stat it ({exc.strerror})"
        ) from None
    if mode & 0o077:
        raise SettingError(
            "JWT_PRIVATE_KEY",
            str(path),
            f"its mode is {mode:04o}; allowed: 0600 or stricter (chmod 600 it)",
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise SettingError(
            "JWT_PRIVATE_KEY", str(path), f"cannot read it ({exc.strerror})"
        ) from None
    except (ValueError, TypeError):
        raise SettingError(
            "JWT_PRIVATE_KEY", str(path), "not an unencrypted PEM private key"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SettingError("JWT_PRIVATE_KEY", str(path), "allowed: an Ed25519 key (EdDSA)")
    return key


def _write_private_key(path: Path, key: Ed25519PrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_file("JWT_PRIVATE_KEY", path, pem, 0o600)


def write_public_key(path: Path, key: Ed25519PublicKey) -> None:
    """Write ``JWT_PUBLIC_KEY`` atomically unless it holds ``key``; SettingError if it cannot."""
    _write_if_changed("JWT_PUBLIC_KEY", path, key)


def _write_if_changed(setting: str, path: Path, key: Ed25519PublicKey) -> None:
    pem = public_pem(key)
    with suppress(OSError):
        if path.read_bytes() == pem:
            return
    _write_file(setting, path, pem, 0o644)


def _read_entries(files: KeyFiles) -> list[dict[str, Any]]:
    try:
        document = json.loads(files.keyring.read_bytes())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SettingError(
            "JWT_KEYRING", str(files.keyring), f"cannot read it ({exc.strerror})"
        ) from None
    except ValueError:
        raise SettingError("JWT_KEYRING", str(files.keyring), "not JSON") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("kid"), str)
        and isinstance(e.get("public_key"), str)
        and (e.get("retired_at") is None or isinstance(e.get("retired_at"), int))
        for e in entries
    ):
        raise SettingError(
            "JWT_KEYRING",
            str(files.keyring),
            'allowed: {"keys": [{"kid", "public_key", "created_at", "retired_at"}, ...]}',
        )
    return entries


def _write_entries(files: KeyFiles, entries: list[dict[str, Any]]) -> None:
    document = {"keys": entries}
    _write_file(
        "JWT_KEYRING", files.keyring, json.dumps(document, indent=2).encode() + b"\n", 0o644
    )


def _write_file(setting: str, path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically with ``data``, created with ``mode`` (less the umask)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with suppress(OSError):
            tmp.unlink()
        raise SettingError(setting, str(path), f"cannot write it ({exc.strerror})") from None


# ---- issuing ---------------------------------------------------------------------------


class KeySource(Protocol):
    """Where a :class:`TokenIssuer` takes its keys: the files here, or the database's keyring."""

    def signing_key(self, now_s: float) -> tuple[str, Ed25519PrivateKey]:
        """The ``kid`` and private key that sign a token issued at ``now_s``."""
        ...

    def served(self, now_s: float, ttl_s: int) -> tuple[PublicKey, ...]:
        """The public keys of the JWK set at ``now_s``."""
        ...


class FileKeys:
    """The keys in the files (one replica): the signing key signs from the moment it is made.

    The keyring file is looked at (one ``stat``) at most once a second; when it has been
    replaced, the keys are read again and the new signing key signs from then on. Keys
    that do not agree (a rotation half done) leave the current ones in place until the
    next look.
    """

    def __init__(self, files: KeyFiles, keyring: Keyring) -> None:
        self.files = files
        self.keyring = keyring
        self._keyring_stat = self._stat_keyring()
        self._next_look_s = time.monotonic() + REFRESH_INTERVAL_S

    def signing_key(self, now_s: float) -> tuple[str, Ed25519PrivateKey]:
        """The keyring's signing key (after taking up a rotation done since the last look)."""
        self.refresh()
        return self.keyring.kid, self.keyring.private_key

    def served(self, now_s: float, ttl_s: int) -> tuple[PublicKey, ...]:
        """The signing key and the retired keys whose tokens may still be live."""
        self.refresh()
        return self.keyring.served(now_s, ttl_s)

    def refresh(self) -> None:
        """Take up a rotation done since the last look (looks at most once a second)."""
        now_s = time.monotonic()
        if now_s < self._next_look_s:
            return
        self._next_look_s = now_s + REFRESH_INTERVAL_S
        stat = self._stat_keyring()
        if stat == self._keyring_stat:
            return
        try:
            keyring = read_keys(self.files)
        except SettingError as exc:
            log.warning("keys not reloaded, keeping %s: %s", self.keyring.kid, exc)
            return
        self._keyring_stat = stat
        if keyring.kid != self.keyring.kid:
            log.info("signing key rotated: %s -> %s", self.keyring.kid, keyring.kid)
        self.keyring = keyring

    def _stat_keyring(self) -> tuple[int, int, int] | None:
        try:
            stat = self.files.keyring.stat()
        except OSError:
            return None
        return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


class TokenIssuer:
    """Signs tokens with the signing key of the moment and serves the JWK set."""

    def __init__(
        self,
        keys: KeySource,
        *,
        issuer: str,
        audience: str,
        ttl_s: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.issuer = issuer
        self.audience = audience
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, username: str) -> str:
        """A signed token for ``username`` (sub, iss, aud, iat, exp, jti; ``kid`` header)."""
        now_s = self._clock()
        kid, private_key = self.keys.signing_key(now_s)
        now = int(now_s)
        payload = {
            "sub": username,
            "iss": self.issuer,
            "aud": self.audience,
            "iat": now,
            "exp": now + self.ttl_s,
            "jti": uuid.uuid4().hex,
        }
        return jwt.encode(payload, private_key, algorithm=ALGORITHM, headers={"kid": kid})

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """The JWK set: every public key a token may carry now or is about to."""
        keys = self.keys.served(self._clock(), self.ttl_s)
        return {"keys": [key.jwk() for key in keys]}
