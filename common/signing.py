"""Signed bundles: an Ed25519 signature over ``manifest.json``, which lists every file's sha256.

``sac-export --sign-key KEY`` writes ``manifest.sig`` beside the manifest; ``sac-edge run/bench
--trusted-keys DIR`` accepts a bundle only if that signature verifies under one of the public keys
(``*.pub``) in ``DIR``, so a bundle altered anywhere (a file, a checksum, the manifest itself) after signing
is refused. ``sac-edge keygen NAME`` writes a key pair. ``signature_state`` reports what a bundle carries
for ``sac-edge doctor``. The keys and signature use the ``cryptography`` package (OpenSSL's Ed25519);
no torch here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import NamedTuple

# cryptography warns at import that Python 3.8 (JetPack 5's) is deprecated; on the device that would be a
# second stderr line on every command, so that one warning (and only it) is not shown
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Python 3\.8 is no longer supported")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .atomic import atomic_write_json
from .bounded import read_capped
from .bundle_format import MANIFEST, SIGNATURE
from .errors import SacEdgeError
from .jsonfile import read_json
from .manifest import MAX_MANIFEST_BYTES, manifest_bytes

PUBLIC_SUFFIX = ".pub"
ALGORITHM = "ed25519"
MAX_KEY_BYTES = 64 << 10
MAX_TRUSTED_KEYS = 1000

# signature states reported by ``signature_state``
UNSIGNED = "unsigned"
SIGNED = "signed"  # a well-formed signature, not checked (no trusted keys given)
TRUSTED = "trusted"  # verified under a trusted key
UNKNOWN_KEY = "unknown-key"  # signed by a key that is not among the trusted ones
INVALID = "invalid"  # malformed, or does not verify under its key


class SignatureState(NamedTuple):
    """What a bundle's signature says: ``state`` (one of the constants above), the signing key's id (the
    first 16 hex digits of the sha256 of its raw public key) when known, and a one-line ``detail``."""

    state: str
    key_id: str | None
    detail: str


def key_id(public: Ed25519PublicKey) -> str:
    """The short id of a public key (also written into ``manifest.sig``)."""
    raw = public.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(out: str | Path) -> tuple[Path, Path]:
    """Write a new Ed25519 private key to ``out`` (PEM, mode 0600) and its public key to ``out.pub``.

    Refuses to overwrite either file (a lost signing key cannot be recovered); creates missing folders (0700)."""
    private_path = Path(out)
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    for path in (private_path, public_path):
        if os.path.lexists(path):  # a dangling symlink too: never written through
            raise SacEdgeError(f"{path} already exists; choose another name (keys are never overwritten)")
    _make_parents(private_path.parent)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    public_pem = key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    # Each file is complete before it is claimed (a synced temp file, linked in place only if nothing, not
    # even a symlink, took the name meanwhile).
    _write_new_file(private_path, private_pem, 0o600)
    try:
        _write_new_file(public_path, public_pem, 0o644)
    except BaseException:  # a pair or nothing: the private key alone would be signed with and never trusted
        private_path.unlink()
        raise
    return private_path, public_path


def _make_parents(folder: Path) -> None:
    """Create the missing folders above a new key, each 0700 (only its owner may list a folder of keys);
    one that exists and is not a folder (a symlink to a file, a dangling one) is refused in one line."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        raise SacEdgeError(f"{folder} is not a directory; choose another place for the keys")
    for made in reversed(missing):
        os.mkdir(made, 0o700)


def unignored_work_tree(path: Path) -> Path | None:
    """The git work tree ``path`` lies in when git does not ignore it (a commit would publish it), else None:
    outside any work tree, ignored, or no git to ask."""
    git = shutil.which("git")
    if git is None:
        return None
    where = ["-C", str(path.parent)]
    top = subprocess.run([git, *where, "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False)
    if top.returncode != 0:
        return None
    ignored = subprocess.run([git, *where, "check-ignore", "-q", "--", path.name], capture_output=True, check=False)
    return Path(top.stdout.strip()) if ignored.returncode == 1 else None


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Write a new file whole or not at all: a hidden temporary file beside it, synced, then hard-linked to
    ``path`` (which fails if anything, a dangling symlink too, appeared there). A full disk leaves no empty
    or truncated key behind, only the one line."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            os.unlink(tmp)
            raise
        try:
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
    except FileExistsError:
        raise SacEdgeError(f"{path} already exists; choose another name (keys are never overwritten)") from None
    except OSError as err:
        raise SacEdgeError(
            f"cannot write {path} ({err.strerror or err}); free space on its disk or choose another directory"
        ) from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PEM, unencrypted), or one SacEdgeError line."""
    key_path = Path(path)
    fix = "create one with sac-edge keygen NAME"
    if not key_path.is_file():
        raise SacEdgeError(f"--sign-key {key_path}: no such file; {fix}")
    try:
        key = ser.load_pem_private_key(read_capped(key_path, MAX_KEY_BYTES, "signing key", fix), password=None)
    except (ValueError, TypeError) as err:
        raise SacEdgeError(f"--sign-key {key_path}: not an unencrypted PEM private key ({err}); {fix}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SacEdgeError(f"--sign-key {key_path}: not an Ed25519 key; {fix}")
    return key


def load_trusted_keys(directory: str | Path) -> dict[str, Ed25519PublicKey]:
    """The public keys (``*.pub``, PEM) in ``directory`` by key id; an empty or unreadable directory, or a
    file that is not an Ed25519 public key, is one SacEdgeError line."""
    root = Path(directory)
    if not root.is_dir():
        raise SacEdgeError(f"--trusted-keys {root}: not a directory of *{PUBLIC_SUFFIX} public keys")
    keys: dict[str, Ed25519PublicKey] = {}
    paths = sorted(root.glob(f"*{PUBLIC_SUFFIX}"))
    if len(paths) > MAX_TRUSTED_KEYS:  # never dropped silently: the dropped one may be the signer's
        raise SacEdgeError(
            f"--trusted-keys {root}: holds {len(paths)} *{PUBLIC_SUFFIX} files, more than the {MAX_TRUSTED_KEYS} "
            "read; keep the keys this device trusts in a directory of their own"
        )
    for path in paths:
        try:
            key = ser.load_pem_public_key(read_capped(path, MAX_KEY_BYTES, "public key", "remove it"))
        except ValueError as err:
            raise SacEdgeError(f"--trusted-keys: {path} is not a PEM public key ({err}); remove it") from None
        except OSError as err:
            raise SacEdgeError(f"--trusted-keys: cannot read {path} ({err.strerror or err}); remove it") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SacEdgeError(f"--trusted-keys: {path} is not an Ed25519 public key; remove it")
        keys[key_id(key)] = key
    if not keys:
        raise SacEdgeError(f"--trusted-keys {root}: holds no *{PUBLIC_SUFFIX} public keys (sac-edge keygen writes one)")
    return keys


def sign_bundle(bundle: Path, key: Ed25519PrivateKey) -> str:
    """Sign ``bundle/manifest.json`` into ``bundle/manifest.sig``; returns the key id."""
    manifest = read_capped(bundle / MANIFEST, MAX_MANIFEST_BYTES, "bundle manifest", "re-export the bundle")
    kid = key_id(key.public_key())
    signature = base64.b64encode(key.sign(manifest)).decode("ascii")
    atomic_write_json(bundle / SIGNATURE, {"algorithm": ALGORITHM, "key_id": kid, "signature": signature})
    return kid


def signature_state(
    bundle: str | Path, trusted_keys: str | Path | None = None, manifest: bytes | None = None
) -> SignatureState:
    """What ``bundle``'s signature is: unsigned, signed (not checked: no ``trusted_keys``), trusted,
    signed by an unknown key, or invalid. Never raises for a bad signature (``sac-edge doctor`` reports
    it); a bad ``trusted_keys`` directory is a SacEdgeError. ``manifest``: the manifest's bytes as the
    caller read them (and will parse); neither file is read through a symlink."""
    root = Path(bundle)
    keys = load_trusted_keys(trusted_keys) if trusted_keys is not None else None
    if not (root / SIGNATURE).is_file() and not (root / SIGNATURE).is_symlink():
        return SignatureState(UNSIGNED, None, f"no {SIGNATURE}")
    try:
        record = read_json(
            root / SIGNATURE, "bundle signature", "re-sign the bundle", max_bytes=MAX_KEY_BYTES, follow=False
        )
        kid, encoded = record.get("key_id"), record.get("signature")
        if record.get("algorithm") != ALGORITHM or not isinstance(kid, str) or not isinstance(encoded, str):
            return SignatureState(INVALID, None, f"{SIGNATURE} is not an {ALGORITHM} signature record")
        signature = base64.b64decode(encoded, validate=True)
        if manifest is None:
            manifest = manifest_bytes(root)
    except (SacEdgeError, binascii.Error, OSError) as err:
        return SignatureState(INVALID, None, str(err).splitlines()[0] if str(err) else type(err).__name__)
    kid = kid[:16]
    if keys is None:
        return SignatureState(SIGNED, kid, f"signed by key {kid} (not checked: no --trusted-keys)")
    public = keys.get(kid)
    if public is None:
        return SignatureState(UNKNOWN_KEY, kid, f"signed by key {kid}, which is not among the trusted keys")
    try:
        public.verify(signature, manifest)
    except InvalidSignature:
        return SignatureState(INVALID, kid, f"the signature by key {kid} does not match manifest.json")
    return SignatureState(TRUSTED, kid, f"signed by trusted key {kid}")


def require_trusted(bundle: str | Path, trusted_keys: str | Path, manifest: bytes | None = None) -> SignatureState:
    """``signature_state`` that must be ``trusted``; anything else is one SacEdgeError line."""
    state = signature_state(bundle, trusted_keys, manifest)
    if state.state != TRUSTED:
        raise SacEdgeError(
            f"{bundle}: refused by --trusted-keys: {state.detail}; use a bundle signed with "
            "sac-export --sign-key by a key whose .pub is in the trusted directory"
        )
    return state
