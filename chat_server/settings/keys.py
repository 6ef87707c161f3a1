"""How tokens are verified: the public key or JWK sets, the algorithm and the claims."""

from __future__ import annotations

from chatlab.settings import Spec, http_urls, number, text

ASYMMETRIC_JWT_ALGORITHMS = ("EdDSA", "ES256", "ES384", "ES512", "RS256", "RS384", "RS512", "PS256")


def _jwt_algorithm(raw: str) -> str:
    value = raw.strip()
    if value not in ASYMMETRIC_JWT_ALGORITHMS:
        raise ValueError(
            "allowed: " + ", ".join(ASYMMETRIC_JWT_ALGORITHMS) + " (never none, never HS*)"
        )
    return value


def _max_age(raw: str) -> float | None:
    """``auto`` (None) or a number of seconds, at least 1."""
    if raw.strip() == "auto":
        return None
    try:
        return number(1)(raw)
    except ValueError:
        raise ValueError("allowed: auto (3 x JWKS_REFRESH_S) or a number >= 1") from None


def _jwks_urls(raw: str) -> tuple[str, ...]:
    """Empty (keys from JWT_PUBLIC_KEY) or one or more JWK set URLs, comma-separated."""
    return http_urls(raw) if raw.strip() else ()


KEYS_SPECS: tuple[Spec, ...] = (
    Spec(
        "JWT_PUBLIC_KEY",
        "jwt_public_key",
        "keys/jwt_public.pem",
        text,
        "PEM public key the chat server verifies tokens with",
    ),
    Spec(
        "JWT_ALGORITHM",
        "jwt_algorithm",
        "EdDSA",
        _jwt_algorithm,
        "the only token algorithm accepted",
    ),
    Spec("JWT_ISSUER", "jwt_issuer", "chatlab-auth", text, "required iss of every token"),
    Spec("JWT_AUDIENCE", "jwt_audience", "chatlab-chat", text, "required aud of every token"),
    Spec(
        "JWT_JWKS_URL",
        "jwt_jwks_url",
        "",
        _jwks_urls,
        "take keys from this JWK set instead of JWT_PUBLIC_KEY (empty: off); several "
        "auth replicas' sets, comma-separated: the keys of every set that answers",
    ),
    Spec(
        "JWKS_REFRESH_S",
        "jwks_refresh_s",
        "60",
        number(1),
        "seconds between background refreshes of the JWK set",
    ),
    Spec(
        "JWKS_MAX_AGE_S",
        "jwks_max_age_s",
        "auto",
        _max_age,
        "age (since the last refresh that worked) past which the JWK set is stale: its keys "
        "are still accepted, /healthz and chat_jwks_age_seconds say so, the alert fires "
        "(auto: 3 x JWKS_REFRESH_S; a number: at least 2 x JWKS_REFRESH_S)",
    ),
    Spec(
        "JWT_LEEWAY_S",
        "jwt_leeway_s",
        "5",
        number(0, 300),
        "seconds the auth host's clock may be off from this one's: allowed on exp, nbf, iat",
    ),
)
