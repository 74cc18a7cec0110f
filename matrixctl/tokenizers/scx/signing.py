"""pi-signatures: Ed25519 keys, key ids, trust files, signing and checking H_TOK.

Ed25519 comes from `cryptography` (pyca), imported inside the functions that need it.

- A private key file is PKCS#8 PEM, unencrypted, created with mode 0600 (never widened, never
  printed). Loading refuses a key file that group or others can read.
- A public key line (the `.pub` file `keygen` writes, and every line of a trust file) is
  `pi-ed25519 <64 hex digits of the raw public key> [comment]`; `#` starts a comment line.
- A key id is `pi:` + the first 16 hex digits of blake3-256(raw public key): derived from the
  key, so an id can never name another key.
- The signature is Ed25519 (RFC 8032, deterministic) over the 32 bytes of H_TOK.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from matrixctl import codes
from matrixctl.errors import FormatError, InputError, OutputError, UsageError, from_os_error
from matrixctl.tokenizers.scx import tokens as scx_tokens

G = "scx"
SCX_KEY_FILE = codes.define(
    "SCX_KEY_FILE",
    "An SCX key or trust file cannot be used (not an Ed25519 key, bad line, unsafe permissions).",
    group=G,
)

PUB_PREFIX = "pi-ed25519"
TRUST_ENV = "MATRIXCTL_SCX_TRUST"
MAX_KEY_FILE = 1 << 20


def key_id(public_key: bytes) -> str:
    return "pi:" + scx_tokens.blake3_256(public_key).hex()[:16]


def public_line(public_key: bytes, comment: str = "") -> str:
    tail = f" {comment}" if comment else ""
    return f"{PUB_PREFIX} {public_key.hex()}{tail}\n"


@dataclass(frozen=True)
class PrivateKey:
    """A loaded Ed25519 private key. `repr` never shows the key material."""

    _key: object

    def __repr__(self) -> str:
        return f"PrivateKey({self.key_id})"

    @property
    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        pub = self._key.public_key()  # type: ignore[attr-defined]
        raw: bytes = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return raw

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def sign(self, message: bytes) -> bytes:
        sig: bytes = self._key.sign(message)  # type: ignore[attr-defined]
        return sig


def generate() -> tuple[PrivateKey, bytes]:
    """A new key and its PKCS#8 PEM bytes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return PrivateKey(key), pem


def write_private(path: str, pem: bytes, *, force: bool = False) -> None:
    """Write a private key atomically with mode 0600 from its creation on.

    The temporary file comes from mkstemp (mode 0600) in the destination folder and is renamed
    into place; its mode is never widened. An existing file is refused unless `force`.
    """
    write_key_pair(path, pem, None, force=force)


def _refuse_existing(path: str) -> None:
    raise OutputError(
        codes.USAGE,
        "exists; refusing to overwrite a key file",
        path=path,
        hint="pass --force to replace it, or choose another name",
    )


def _staged(path: str, data: bytes, mode: int, temps: list[str]) -> str:
    """Write `data` whole to a temporary file beside `path` (fsynced) and return its name."""
    from matrixctl.io import remove_stale_temps, sibling_temp_name

    remove_stale_temps(path)
    tmp = sibling_temp_name(path)
    temps.append(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as fp:
        os.fchmod(fp.fileno(), mode)
        fp.write(data)
        fp.flush()
        os.fsync(fp.fileno())
    return tmp


def write_key_pair(path: str, pem: bytes, public: bytes | None, *, force: bool = False) -> None:
    """Write a private key (mode 0600) and, when given, its public line to PATH.pub: both or
    neither. Both files are written whole and fsynced to temporary names first (a full disk
    fails here, before anything is renamed); then the private key is renamed into place and
    the public file after it. Should the second rename fail, the new private key is removed
    again (unless it replaced one under `force`)."""
    if path == "-":
        raise UsageError("a private key is never written to stdout; name a file with -o")
    pub_path = path + ".pub"
    if not force:
        for p in (path, pub_path) if public is not None else (path,):
            if os.path.lexists(p):
                _refuse_existing(p)
    umask = os.umask(0)
    os.umask(umask)
    temps: list[str] = []
    placed = False
    existed = os.path.lexists(path)
    try:
        priv_tmp = _staged(path, pem, 0o600, temps)
        pub_tmp = None if public is None else _staged(pub_path, public, 0o666 & ~umask, temps)
        os.replace(priv_tmp, path)
        temps.remove(priv_tmp)
        placed = True
        if pub_tmp is not None:
            os.replace(pub_tmp, pub_path)
            temps.remove(pub_tmp)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if placed and not existed and public is not None and not os.path.lexists(pub_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise from_os_error(exc, path, writing=True) from None
        raise


def _read_small(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fp:
            st = os.fstat(fp.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise InputError(codes.IO_IS_DIR, f"is a folder, {what} was expected", path=path)
            data = fp.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise from_os_error(exc, path) from None
    if len(data) > MAX_KEY_FILE:
        raise FormatError(SCX_KEY_FILE, f"{what} is larger than {MAX_KEY_FILE} bytes", path=path)
    return data


def load_private(path: str) -> PrivateKey:
    """Load a PKCS#8 PEM Ed25519 private key; refuse one that group or others can read."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise from_os_error(exc, path) from None
    if stat.S_ISREG(mode) and mode & 0o077:
        raise InputError(
            SCX_KEY_FILE,
            f"private key file has mode {stat.S_IMODE(mode):04o}; group and others must not "
            "read it",
            path=path,
            hint=f"chmod 600 {path}",
        )
    data = _read_small(path, "a private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, Exception) as exc:  # cryptography raises several types
        raise FormatError(
            SCX_KEY_FILE,
            f"not an unencrypted PKCS#8 PEM private key ({type(exc).__name__})",
            path=path,
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise FormatError(SCX_KEY_FILE, "the private key is not an Ed25519 key", path=path)
    return PrivateKey(key)


def parse_public_lines(text: str, path: str) -> list[bytes]:
    keys: list[bytes] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        raw = b""
        if words[0] == PUB_PREFIX and len(words) >= 2:
            with contextlib.suppress(ValueError):
                raw = bytes.fromhex(words[1])
        if len(raw) != 32:
            raise FormatError(
                SCX_KEY_FILE,
                f"line {lineno} is not `{PUB_PREFIX} <64 hex digits> [comment]`",
                path=path,
                field=f"line {lineno}",
            )
        keys.append(raw)
    return keys


def load_trust(paths: Iterable[str]) -> list[bytes]:
    """The trusted public keys listed in the trust files (`.pub` files are trust files too)."""
    keys: list[bytes] = []
    for path in paths:
        data = _read_small(path, "a trust file")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(SCX_KEY_FILE, "trust file is not UTF-8 text", path=path) from None
        found = parse_public_lines(text, path)
        if not found:
            raise FormatError(SCX_KEY_FILE, "trust file lists no keys", path=path)
        keys.extend(k for k in found if k not in keys)
    return keys


def trust_from_env() -> list[str] | None:
    """Trust files named by MATRIXCTL_SCX_TRUST (os.pathsep-separated), or None when unset."""
    value = os.environ.get(TRUST_ENV, "")
    if not value:
        return None
    return [p for p in value.split(os.pathsep) if p]


def valid(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is a valid Ed25519 signature of `message` by `public_key`."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
