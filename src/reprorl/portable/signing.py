"""Signing a bundle: an ed25519 signature over its manifest (and so over every member's sha256)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from reprorl.errors import StoreError, UserInputError

ALGORITHM = "ed25519"


class SignatureError(StoreError):
    """A bundle's signature does not verify, or is not the one asked for."""


def new_key(path: Path) -> str:
    """Write a new ed25519 private key (PKCS#8 PEM, owner-only) to `path`; return its signer id."""
    path = Path(path)
    if path.exists():
        raise UserInputError(f"{path} exists; give a new file name", field="KEY")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return signer_id(key.public_key())


def load_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise UserInputError(
            f"{path}: not a readable unencrypted PEM private key ({exc}); "
            "make one with `reprorl runs keygen`",
            field="--sign",
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserInputError(f"{path}: an ed25519 key is needed, not {type(key).__name__}", field="--sign")
    return key


def signer_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{ALGORITHM}:{hashlib.sha256(raw).hexdigest()[:32]}"


def sign(manifest: bytes, key: Ed25519PrivateKey) -> bytes:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    value = {
        "algorithm": ALGORITHM,
        "public_key": base64.b64encode(raw).decode(),
        "signature": base64.b64encode(key.sign(manifest)).decode(),
    }
    return (json.dumps(value, sort_keys=True) + "\n").encode()


def check(manifest: bytes, signature: bytes) -> str:
    """The signer id of a signature that verifies over `manifest`; SignatureError otherwise."""
    try:
        value = json.loads(signature)
        if value.get("algorithm") != ALGORITHM:
            raise SignatureError(f"signature algorithm {value.get('algorithm')!r} is not {ALGORITHM}")
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(value["public_key"], validate=True))
        public.verify(base64.b64decode(value["signature"], validate=True), manifest)
    except InvalidSignature:
        raise SignatureError(
            "the signature does not match the manifest (it was edited after signing)"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureError(f"the signature cannot be read ({type(exc).__name__})") from None
    return signer_id(public)
