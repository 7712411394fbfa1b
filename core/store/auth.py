"""Password and API-key hashing. Pure functions: no database, no HTTP.

Passwords go through scrypt (a slow, memory-hard KDF) with a random salt; the stored string
carries its own cost parameters, so raising the default later keeps old hashes verifiable.
API keys are long random secrets, so a fast sha256 is enough to store them: nobody can
brute-force 256 random bits, and a fast hash lets a key be looked up by its hash.
Checking who may do what is core.store's job; reading keys from HTTP headers is webui's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass

KEY_PREFIX = "rc-"
KEY_VISIBLE_CHARS = 10  # "rc-" + 7 random characters: enough to tell keys apart in a list
_KEY_RANDOM_BYTES = 32


@dataclass(frozen=True)
class ScryptCost:
    n: int  # CPU/memory cost, a power of two; memory is about 128 * r * n bytes
    r: int = 8
    p: int = 1

    def __post_init__(self) -> None:
        if self.n < 2 or self.n & (self.n - 1) or self.r < 1 or self.p < 1:
            raise ValueError(f"bad scrypt cost {self}: n must be a power of two > 1, r and p >= 1")


# One of OWASP's equivalent scrypt settings (N=2^15, r=8, p=3): 32 MiB and ~0.4 s per hash
# here. It is p rather than n that is raised so that many logins at once stay at 32 MiB each.
DEFAULT_SCRYPT = ScryptCost(n=2**15, r=8, p=3)
_MAXMEM = 512 << 20


def _kdf(password: str, salt: bytes, cost: ScryptCost) -> bytes:
    # NFKC so that the same password typed on two keyboards (composed or decomposed accents)
    # gives the same bytes.
    pw = unicodedata.normalize("NFKC", password).encode("utf-8")
    return hashlib.scrypt(pw, salt=salt, n=cost.n, r=cost.r, p=cost.p, maxmem=_MAXMEM, dklen=32)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def hash_password(password: str, cost: ScryptCost = DEFAULT_SCRYPT) -> str:
    """`scrypt$n$r$p$salt$hash` (base64), for storing."""
    salt = secrets.token_bytes(16)
    return f"scrypt${cost.n}${cost.r}${cost.p}${_b64(salt)}${_b64(_kdf(password, salt, cost))}"


def verify_password(password: str, stored: str) -> bool:
    """True if `password` matches a string made by `hash_password`. Never raises on a bad string."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        cost = ScryptCost(int(n), int(r), int(p))
        expected = base64.b64decode(salt.encode()), base64.b64decode(digest.encode())
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(_kdf(password, expected[0], cost), expected[1])


_dummy_hashes: dict[ScryptCost, str] = {}


def burn_password_check(password: str, cost: ScryptCost = DEFAULT_SCRYPT) -> None:
    """Spend what a real check costs, so "no such user" takes as long as "wrong password"
    and the timing does not tell which user names exist."""
    if cost not in _dummy_hashes:
        _dummy_hashes[cost] = hash_password("", cost)
    verify_password(password, _dummy_hashes[cost])


def new_api_key() -> str:
    """A fresh secret key, `rc-` and 43 url-safe characters. Shown once, never stored."""
    return KEY_PREFIX + secrets.token_urlsafe(_KEY_RANDOM_BYTES)


def api_key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def api_key_visible(key: str) -> str:
    """The short start of a key kept in clear, so a user can tell which key is which."""
    return key[:KEY_VISIBLE_CHARS]


def looks_like_api_key(text: str) -> bool:
    return text.startswith(KEY_PREFIX) and len(text) >= KEY_VISIBLE_CHARS
