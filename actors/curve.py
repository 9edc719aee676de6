"""CURVE security for the client socket: key files, the server's set-up, the client's.

A key is 40 characters of Z85 text (ZeroMQ's encoding of 32 bytes). ``shardnode keygen``
writes a pair: ``NAME.key`` holds the secret key alone (mode 0600; the public key is
derived from it) and ``NAME.pub`` the public key. The node's secret key file is
``[security] curve_secret_key_file``; the public keys of the clients (and peers) allowed in
are the ``*.pub`` files of ``[security] curve_allowed_keys_dir``, read when the front door
starts.

On the server, ``curve_server`` starts ZeroMQ's ZAP authenticator (a thread on the
socket's context) before the socket binds, then makes the socket a CURVE server: every
connection is encrypted, and a client whose public key is not in the allowed directory
fails the handshake and is never heard. libzmq accepts every CURVE client when no ZAP
handler is bound, hence the order. On a client, ``curve_client`` sets the keys before the
socket connects.

pyzmq's own ``configure_curve(location=dir)`` reads czmq certificate files named
``*.key``, which is what ``keygen`` names secret keys; the allowed keys are read here
instead, from ``*.pub`` files, and handed to the authenticator as a callback.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
from zmq.utils import z85

from config import ConfigError, NodeConfig

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger("shardnode")

KEY_Z85_BYTES = 40  # a CURVE key (32 bytes) as Z85 text
KEY_FILE_BYTES_MAX = 1024  # a key file is one key and a newline; anything longer is not one
ALLOWED_KEYS_MAX = 100_000  # public keys read from the allowed directory
SECRET_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"
REFUSED_LOGGED_MAX = 1024  # refused keys remembered so as to log each once
ZAP_DOMAIN = "shardnode"  # the socket's ZAP domain; the authenticator answers for it only
# CVE-2019-13132: a remote stack overflow in the CURVE handshake of libzmq before 4.3.2.
LIBZMQ_CURVE_MIN = (4, 3, 2)


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or holds no key; the message names it."""


@dataclass(frozen=True)
class ServerKeys:
    """The node's key pair (Z85) and the public keys (Z85) allowed to connect."""

    public: bytes
    secret: bytes
    allowed: frozenset[bytes]


def parse_key(text: bytes, where: str) -> bytes:
    """The Z85 key in ``text`` (surrounding whitespace ignored); ``KeyFileError`` naming
    ``where`` if it is not one."""
    key = text.strip()
    if len(key) != KEY_Z85_BYTES or any(c not in z85.Z85MAP for c in key):
        raise KeyFileError(f"{where}: not a CURVE key ({KEY_Z85_BYTES} characters of Z85 "
                           f"text, as `shardnode keygen` writes)")
    return key


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(KEY_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise KeyFileError(f"{path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"{path} cannot be read: {exc.strerror}") from None
    if len(data) > KEY_FILE_BYTES_MAX:
        raise KeyFileError(f"{path} is over {KEY_FILE_BYTES_MAX} bytes: not a key file")
    return data


def read_public_key(path: str | Path) -> bytes:
    """The Z85 public key in the file ``path`` (a ``.pub`` file of ``keygen``)."""
    p = Path(path)
    return parse_key(_read(p), str(p))


def read_keypair(secret_path: str | Path) -> tuple[bytes, bytes]:
    """``(public, secret)``, Z85, from a secret key file (a ``.key`` file of ``keygen``);
    the public key is derived from the secret one."""
    p = Path(secret_path)
    secret = parse_key(_read(p), str(p))
    return zmq.curve_public(secret), secret


def read_allowed_keys(directory: str | Path) -> frozenset[bytes]:
    """The public keys of the ``*.pub`` files in ``directory``; every one must hold a key."""
    d = Path(directory)
    if not d.is_dir():
        raise KeyFileError(f"{d} is not a directory")
    files = sorted(d.glob("*" + PUBLIC_SUFFIX))
    if len(files) > ALLOWED_KEYS_MAX:
        raise KeyFileError(f"{d} holds {len(files)} public keys, more than {ALLOWED_KEYS_MAX}")
    if not files:
        raise KeyFileError(f"{d} holds no {PUBLIC_SUFFIX} files: no client could connect")
    if any(d.glob("*" + SECRET_SUFFIX)):
        log.warning("%s holds %s files: secret keys belong with their owner only; the "
                    "node reads the %s files", d, SECRET_SUFFIX, PUBLIC_SUFFIX)
    return frozenset(read_public_key(f) for f in files)


def check_libzmq() -> None:
    """Refuse a libzmq that cannot do CURVE, or one with the handshake's known overflow."""
    if not zmq.has("curve"):
        raise ConfigError("CURVE is on (security.curve_secret_key_file) but this libzmq "
                          "was built without it: install a pyzmq whose libzmq has CURVE")
    version = tuple(zmq.zmq_version_info())
    if version < LIBZMQ_CURVE_MIN:
        want = ".".join(map(str, LIBZMQ_CURVE_MIN))
        raise ConfigError(f"CURVE is on (security.curve_secret_key_file) but libzmq is "
                          f"{'.'.join(map(str, version))}; CURVE needs {want} or later "
                          f"(CVE-2019-13132): upgrade pyzmq")


def server_keys(cfg: NodeConfig) -> ServerKeys | None:
    """The node's keys when CURVE is on, read and checked; None when it is off. Raises
    ``ConfigError`` naming the setting for a missing or malformed file, and for a libzmq
    that must not be used."""
    sec = cfg.security
    if not sec.curve_secret_key_file:
        return None
    check_libzmq()
    try:
        public, secret = read_keypair(sec.curve_secret_key_file)
    except KeyFileError as exc:
        raise ConfigError(f"security.curve_secret_key_file: {exc}") from None
    try:
        allowed = read_allowed_keys(sec.curve_allowed_keys_dir)
    except KeyFileError as exc:
        raise ConfigError(f"security.curve_allowed_keys_dir: {exc}") from None
    try:
        mode = stat.S_IMODE(os.stat(sec.curve_secret_key_file).st_mode)
    except OSError:  # gone since it was read: the actor that reads it again says so
        mode = 0
    if mode & 0o077:
        log.warning("security.curve_secret_key_file %s is readable by others (mode %04o): "
                    "chmod 600 it", sec.curve_secret_key_file, mode)
    return ServerKeys(public, secret, allowed)


class AllowedKeys:
    """The authenticator's credentials provider: a client is in if its key is listed.

    A refused client reconnects every ``reconnect_ivl`` (100 ms by default), so each
    refused key is logged once, among the last ``REFUSED_LOGGED_MAX`` keys refused."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys
        self.refused = 0
        self.refused_recently: dict[bytes, None] = {}  # insertion-ordered, bounded

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        self.refused += 1
        if key not in self.refused_recently:
            log.warning("refused a CURVE client: its public key %s is not in "
                        "security.curve_allowed_keys_dir", key.decode("ascii", "replace"))
            if len(self.refused_recently) >= REFUSED_LOGGED_MAX:
                del self.refused_recently[next(iter(self.refused_recently))]
            self.refused_recently[key] = None
        return False


def curve_server(sock: zmq.Socket[bytes], cfg: NodeConfig) -> ThreadAuthenticator | None:
    """Make ``sock`` a CURVE server when the config turns CURVE on, with a ZAP
    authenticator on its context admitting the allowed keys; call it before ``bind``.
    Returns the authenticator, which the caller stops when it closes the socket (None when
    CURVE is off). Raises ``RefuseToStart`` when the keys cannot be read."""
    # Imported here: clients import this module too, and these two would double the time
    # ``node.client`` takes to import (the actor base, and asyncio under the ZAP thread).
    from zmq.auth.thread import ThreadAuthenticator

    from actors.base import RefuseToStart

    try:
        keys = server_keys(cfg)
    except ConfigError as exc:
        raise RefuseToStart(str(exc)) from None
    if keys is None:
        return None
    auth = ThreadAuthenticator(sock.context, log=log.getChild("zap"))
    auth.start()
    auth.configure_curve_callback(ZAP_DOMAIN, AllowedKeys(keys.allowed))
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    log.info("CURVE on: %d client key(s) allowed", len(keys.allowed))
    return auth


def curve_client(sock: zmq.Socket[bytes], server_public_key: bytes, public: bytes,
                 secret: bytes) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is
    ``server_public_key``, as the key pair ``(public, secret)`` (all Z85); call it before
    ``connect``."""
    try:
        keys = [parse_key(key, what) for key, what in (
            (server_public_key, "the server's public key"), (public, "the client's public key"),
            (secret, "the client's secret key"))]
    except KeyFileError as exc:
        raise ValueError(str(exc)) from None
    for option, key in zip((zmq.CURVE_SERVERKEY, zmq.CURVE_PUBLICKEY, zmq.CURVE_SECRETKEY),
                           keys, strict=True):
        sock.setsockopt(option, key)
