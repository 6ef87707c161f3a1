"""Token verification at the handshake: the chat server only *verifies* JWTs.

The public key is loaded once at start; each handshake costs one signature check
(PyJWT on ``cryptography``), with ``exp``, ``iss``, ``aud`` and ``sub`` required
and only the configured algorithm accepted (never ``none``, never HS* with a
public key, because the algorithm list has exactly one asymmetric entry).
"""

from __future__ import annotations

from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from chat_server.errors import ChatError
from chat_server.settings import SettingError, Settings

_KEY_TYPES = {
    "EdDSA": (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey),
    "ES": (ec.EllipticCurvePublicKey,),
    "RS": (rsa.RSAPublicKey,),
    "PS": (rsa.RSAPublicKey,),
}


class InvalidToken(ChatError):
    """A token that does not open a chat connection; ``str()`` is the one-line reason."""


class TokenVerifier:
    """Verifies chat tokens against one public key; returns the user (``sub``)."""

    def __init__(self, public_key: object, algorithm: str, issuer: str, audience: str) -> None:
        self._key = public_key
        self._algorithms = [algorithm]
        self._issuer = issuer
        self._audience = audience
        self._jwt = jwt.PyJWT(options={"require": ["exp", "iss", "aud", "sub"]})

    def verify(self, token: str) -> str:
        """Return the token's ``sub`` if it is valid now, else raise :class:`InvalidToken`."""
        try:
            claims = self._jwt.decode(
                token,
                self._key,  # type: ignore[arg-type]
                algorithms=self._algorithms,
                issuer=self._issuer,
                audience=self._audience,
            )
        except jwt.ExpiredSignatureError:
            raise InvalidToken("token expired") from None
        except jwt.InvalidAlgorithmError:
            raise InvalidToken(
                f"token algorithm not allowed (only {self._algorithms[0]})"
            ) from None
        except jwt.InvalidSignatureError:
            raise InvalidToken("token signature does not verify") from None
        except jwt.InvalidAudienceError:
            raise InvalidToken("token audience is not this server") from None
        except jwt.InvalidIssuerError:
            raise InvalidToken("token issuer is not trusted") from None
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"token lacks the {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise InvalidToken("token sub is not a user name")
        return sub


def load_verifier(settings: Settings) -> TokenVerifier:
    """Load ``JWT_PUBLIC_KEY`` for ``JWT_ALGORITHM``; a missing or wrong key is a SettingError."""
    path = Path(settings.jwt_public_key)
    try:
        key = load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise SettingError(
            "JWT_PUBLIC_KEY",
            settings.jwt_public_key,
            f"cannot read it ({exc.strerror}); start the auth service first, it writes this file",
        ) from None
    except ValueError:
        raise SettingError(
            "JWT_PUBLIC_KEY", settings.jwt_public_key, "not a PEM public key"
        ) from None
    family = "EdDSA" if settings.jwt_algorithm == "EdDSA" else settings.jwt_algorithm[:2]
    if not isinstance(key, _KEY_TYPES[family]):
        raise SettingError(
            "JWT_PUBLIC_KEY",
            settings.jwt_public_key,
            f"the key does not suit JWT_ALGORITHM={settings.jwt_algorithm}",
        )
    return TokenVerifier(key, settings.jwt_algorithm, settings.jwt_issuer, settings.jwt_audience)
