"""CURVE on the client socket: keygen, the [security] settings, the libzmq check, and a
real node that serves the clients whose keys it allows and no other."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import zmq

from actors import curve
from actors.cluster_state import PEER_PREFIX
from config import ConfigError, NodeConfig, load_config
from config.cluster import Member, cluster_text
from config.schema import validate
from node import cli
from node.client import NodeClient, read_keypair, read_public_key
from node.handshake import HandshakeFailed
from node.local import LocalNode, free_port
from node.supervisor import Supervisor
from wire import protocol
from wire.errors import ErrorCode, NodeError, RequestTimeout
from wire.packer import pack_map
from wire.protocol import request_map

if TYPE_CHECKING:
    from tests.conftest import MakeNode

REFUSED_TIMEOUT_MS = 500  # how long a refused client waits for the answer it never gets


def keygen(directory: Path, name: str) -> tuple[bytes, bytes]:
    """``shardnode keygen DIR --name NAME``; the pair it wrote."""
    assert cli.main(["keygen", str(directory), "--name", name]) == 0
    return read_keypair(directory / f"{name}.key")


@dataclasses.dataclass
class Keys:
    """A node's key pair, one allowed client's, and the config that turns CURVE on."""

    node: tuple[bytes, bytes]
    client: tuple[bytes, bytes]
    secret_file: Path
    allowed_dir: Path

    def config(self) -> str:
        return (f'[security]\ncurve_secret_key_file = "{self.secret_file}"\n'
                f'curve_allowed_keys_dir = "{self.allowed_dir}"\n')


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    node_keys = keygen(tmp_path / "node-keys", "node")
    client_keys = keygen(tmp_path / "client-keys", "client")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "client.pub").write_bytes((tmp_path / "client-keys" / "client.pub").read_bytes())
    return Keys(node_keys, client_keys, tmp_path / "node-keys" / "node.key", allowed)


def curve_config(keys: Keys, **node: Any) -> NodeConfig:
    return load_config(overrides={"node": node, "security": {
        "curve_secret_key_file": str(keys.secret_file),
        "curve_allowed_keys_dir": str(keys.allowed_dir)}})


# ---- a node with CURVE on ------------------------------------------------------------------


def test_a_curve_node_serves_a_client_whose_key_it_allows(make_node: MakeNode,
                                                          keys: Keys, tmp_path: Path) -> None:
    node = make_node(keys.config(), server_public_key=keys.node[0], client_keys=keys.client)
    with NodeClient(node.endpoint, timeout_ms=10_000, server_public_key=keys.node[0],
                    client_keys=keys.client) as c:
        c.create_topic("secret")
        partition, offset = c.produce("secret", b"sealed")
        assert [r.value for r in c.read("secret", partition, offset)] == [b"sealed"]
    # The shell's commands too, with the key files.
    out = subprocess.run(
        [sys.executable, "-m", "node", "topics", "--port", str(node.port),
         "--server-key", str(tmp_path / "node-keys" / "node.pub"),
         "--client-key", str(tmp_path / "client-keys" / "client.key")],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "secret" in out.stdout


def test_a_curve_node_answers_no_client_it_does_not_allow(make_node: MakeNode,
                                                          keys: Keys) -> None:
    node = make_node(keys.config(), server_public_key=keys.node[0], client_keys=keys.client)
    stranger = zmq.curve_keypair()  # a valid key pair, not in the allowed directory
    with NodeClient(node.endpoint, timeout_ms=REFUSED_TIMEOUT_MS, retries=0,
                    server_public_key=keys.node[0], client_keys=stranger) as c, \
            pytest.raises(HandshakeFailed, match="refused this client's CURVE key"):
        c.list_topics()
    with NodeClient(node.endpoint, timeout_ms=REFUSED_TIMEOUT_MS, retries=0) as plain, \
            pytest.raises(RequestTimeout, match="CURVE") as info:
        plain.list_topics()  # no CURVE at all
    # At once when the probe reads why (the node may close first: then the timeout says it)
    assert isinstance(info.value, HandshakeFailed) or "needs keys" in str(info.value)
    wrong = zmq.curve_keypair()[0]  # not the node's public key: the handshake never completes
    with NodeClient(node.endpoint, timeout_ms=REFUSED_TIMEOUT_MS, retries=0,
                    server_public_key=wrong, client_keys=keys.client) as c, \
            pytest.raises(RequestTimeout, match="is the server key this node's public key"):
        c.list_topics()
    with node.client(timeout_ms=10_000) as c:  # the allowed client is still served
        c.create_topic("after")
        assert [t.name for t in c.list_topics()] == ["after"]
    assert "refused a CURVE client" in node.log_tail(200)


def test_a_refused_client_is_told_why_at_once_and_not_retried(make_node: MakeNode,
                                                                 keys: Keys) -> None:
    """A refused client's first request is queued for a connection that never comes up (its
    CURVE handshake fails and is dropped): it used to wait out its timeout on every one of
    its retries (and once blocked for good in a retry's send). A probe of the handshake
    (node/handshake.py) says why after a second, and trying again cannot help."""
    node = make_node(keys.config(), server_public_key=keys.node[0], client_keys=keys.client)
    outcome: list[BaseException] = []

    def call() -> None:
        # 5 retries (the default) of a minute each: only the probe ends this in time.
        with NodeClient(node.endpoint, timeout_ms=60_000, server_public_key=keys.node[0],
                        client_keys=zmq.curve_keypair()) as stranger:  # a key not allowed
            try:
                stranger.list_topics()
            except BaseException as exc:  # reported below
                outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=30)
    assert not caller.is_alive(), "the refused client waited out its timeout"
    (exc,) = outcome
    assert isinstance(exc, HandshakeFailed), exc
    assert isinstance(exc, RequestTimeout)  # what such a client got before, still


def test_the_shell_with_a_wrong_server_key_is_told_at_once_and_not_retried(
        make_node: MakeNode, keys: Keys, tmp_path: Path) -> None:
    """``--server-key`` names another node's public key: the handshake fails each time
    libzmq tries it, which the probe sees within its first second or two. It used to be
    said only after every retry had waited out its timeout (6 attempts of 10 s: 61 s)."""
    node = make_node(keys.config(), server_public_key=keys.node[0], client_keys=keys.client)
    keygen(tmp_path / "other-node", "node")  # a valid public key, not this node's
    timeout_ms = 10_000  # the command's default, said here: one attempt's wait
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "node", "topics", "--port", str(node.port),
         "--timeout-ms", str(timeout_ms),
         "--server-key", str(tmp_path / "other-node" / "node.pub"),
         "--client-key", str(tmp_path / "client-keys" / "client.key")],
        capture_output=True, text=True, timeout=90, env={**os.environ, "COLUMNS": "500"})
    waited_s = time.monotonic() - started
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "is the server key this node's public key" in out.stderr, out.stderr
    assert "attempts" not in out.stderr, out.stderr
    assert waited_s < timeout_ms / 1000, f"{waited_s:.1f} s: not told at once"


def test_a_refused_pipeline_is_told_why_by_its_poll(make_node: MakeNode, keys: Keys) -> None:
    """A pipeline's requests to a node that refuses its client's key are never answered:
    its poll used to return nothing, for good. A probe of the handshake once a request has
    waited ``PROBE_AFTER_MS`` raises why, long before the client's timeout."""
    from node.handshake import PROBE_AFTER_MS

    node = make_node(keys.config(), server_public_key=keys.node[0], client_keys=keys.client)
    with NodeClient(node.endpoint, timeout_ms=60_000, server_public_key=keys.node[0],
                    client_keys=zmq.curve_keypair()) as stranger:  # a key not allowed
        pipe = stranger.pipeline()
        pipe.submit("sealed", [b"v"], partition=0)
        start = time.monotonic()
        with pytest.raises(HandshakeFailed, match="refused this client's CURVE key"):
            while time.monotonic() - start < 20:
                assert pipe.poll(200) == []
        assert PROBE_AFTER_MS / 1000 <= time.monotonic() - start < 10
        assert len(pipe.in_flight) == 1  # not answered: the caller was told why


def test_a_node_without_curve_does_not_answer_a_curve_client(node: LocalNode,
                                                             keys: Keys) -> None:
    """The other side of the test above: a client's keys alone secure nothing; the
    refusals come from the node's set-up."""
    with NodeClient(node.endpoint, timeout_ms=REFUSED_TIMEOUT_MS, retries=0,
                    server_public_key=keys.node[0], client_keys=keys.client) as c, \
            pytest.raises(RequestTimeout, match="run CURVE") as info:
        c.list_topics()
    # Told at once when the probe reads the node's refusal of the mechanism; the node may
    # close the connection before the client reads it, and then the timeout names it.
    assert isinstance(info.value, HandshakeFailed) or "and does the node run CURVE" in str(
        info.value), info.value


# ---- keygen --------------------------------------------------------------------------------


def test_keygen_writes_a_secret_only_its_owner_can_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    opened: list[tuple[str, int, int]] = []
    real_open = os.open

    def recording_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        opened.append((str(path), flags, mode))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", recording_open)
    old_umask = os.umask(0)  # the modes must not depend on the umask
    try:
        assert cli.main(["keygen", str(tmp_path / "k"), "--name", "n1"]) == 0
    finally:
        os.umask(old_umask)
    secret_file, public_file = tmp_path / "k" / "n1.key", tmp_path / "k" / "n1.pub"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_file.stat().st_mode) == 0o644
    # Created with its mode, never over an existing file: not readable even briefly.
    (_path, flags, mode), = [o for o in opened if o[0] == str(secret_file)]
    assert mode == 0o600
    assert flags & os.O_CREAT and flags & os.O_EXCL
    public, secret = read_keypair(secret_file)
    assert read_public_key(public_file) == public == zmq.curve_public(secret)
    assert secret.decode() not in public_file.read_text()
    out = capsys.readouterr().out
    assert str(secret_file) in out and str(public_file) in out and public.decode() in out


def test_keygen_refuses_to_overwrite_a_key(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    keygen(tmp_path, "n1")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert cli.main(["keygen", str(tmp_path), "--name", "n1"]) == 2
    assert "not overwriting" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / "n2.pub").write_text("someone's\n")  # half a pair is not overwritten either
    assert cli.main(["keygen", str(tmp_path), "--name", "n2"]) == 2
    assert not (tmp_path / "n2.key").exists()
    assert (tmp_path / "n2.pub").read_text() == "someone's\n"


# ---- configuration -------------------------------------------------------------------------


def test_listening_beyond_loopback_requires_curve(keys: Keys) -> None:
    for host in ("0.0.0.0", "10.1.2.3", "node.example", "*"):
        with pytest.raises(ConfigError) as info:
            load_config(overrides={"node": {"host": host}})
        msg = str(info.value)
        assert f"listening on {host} requires CURVE" in msg
        assert "security.curve_secret_key_file" in msg
        assert curve_config(keys, host=host).node.host == host  # with CURVE on it may
    for host in ("127.0.0.1", "127.0.0.2", "localhost"):  # (IPv6 is refused: test_config)
        assert load_config(overrides={"node": {"host": host}}).node.host == host


def test_curve_without_an_allowed_keys_dir_is_refused(keys: Keys) -> None:
    cfg = curve_config(keys)
    no_dir = dataclasses.replace(cfg, security=dataclasses.replace(
        cfg.security, curve_allowed_keys_dir=""))
    with pytest.raises(ConfigError, match=r"security\.curve_allowed_keys_dir must be set"):
        validate(no_dir)
    no_secret = dataclasses.replace(cfg, security=dataclasses.replace(
        cfg.security, curve_secret_key_file=""))
    with pytest.raises(ConfigError, match="CURVE is off"):
        validate(no_secret)


def _bad(keys: Keys, case: str) -> str:
    """Break one file of ``keys`` as ``case`` says; the setting the error must name."""
    if case == "secret missing":
        keys.secret_file.unlink()
        return "security.curve_secret_key_file"
    if case == "secret malformed":
        keys.secret_file.write_text("not a key\n")
        return "security.curve_secret_key_file"
    if case == "secret too long":
        keys.secret_file.write_bytes(b"x" * (curve.KEY_FILE_BYTES_MAX + 1))
        return "security.curve_secret_key_file"
    if case == "allowed key malformed":
        (keys.allowed_dir / "broken.pub").write_text(zmq.curve_keypair()[0].decode()[:-1])
        return "broken.pub"
    if case == "allowed dir empty":
        for p in keys.allowed_dir.iterdir():
            p.unlink()
        return "security.curve_allowed_keys_dir"
    assert case == "allowed dir missing"
    keys.allowed_dir.rename(keys.allowed_dir.with_name("elsewhere"))
    return "security.curve_allowed_keys_dir"


BAD_FILES = ["secret missing", "secret malformed", "secret too long", "allowed key malformed",
             "allowed dir empty", "allowed dir missing"]


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_key_file_is_a_config_error(keys: Keys, case: str) -> None:
    cfg = curve_config(keys)
    assert curve.server_keys(cfg) == curve.ServerKeys(
        *keys.node, frozenset([keys.client[0]]))
    named = _bad(keys, case)
    with pytest.raises(ConfigError) as info:
        curve.server_keys(cfg)
    assert named in str(info.value)


def test_the_node_refuses_to_start_on_a_bad_key_file(keys: Keys, tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(keys.config())
    keys.secret_file.write_text("not a key\n")
    out = subprocess.run([sys.executable, "-m", "node", "start", "--config", str(config),
                          "--data-dir", str(tmp_path / "data"), "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "config error" in out.stderr
    assert "security.curve_secret_key_file" in out.stderr
    assert not (tmp_path / "data" / "LOCK").exists()  # refused before anything started


def test_keys_allowed_and_refused_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    allowed = zmq.curve_keypair()[0]
    provider = curve.AllowedKeys(frozenset([allowed]))
    assert provider.callback(curve.ZAP_DOMAIN, allowed)
    stranger = zmq.curve_keypair()[0]
    assert not any(provider.callback(curve.ZAP_DOMAIN, stranger) for _ in range(50))
    refusals = [r for r in caplog.records if "refused a CURVE client" in r.getMessage()]
    assert len(refusals) == 1 and stranger.decode() in refusals[0].getMessage()
    assert provider.refused == 50


def test_client_keys_come_in_pairs(keys: Keys) -> None:
    with pytest.raises(ValueError, match="both"):
        NodeClient("tcp://127.0.0.1:1", server_public_key=keys.node[0])
    with pytest.raises(ValueError, match="not a CURVE key"):
        NodeClient("tcp://127.0.0.1:1", server_public_key=b"short", client_keys=keys.client)


# ---- libzmq ----------------------------------------------------------------------------


def test_a_libzmq_before_4_3_2_is_refused_before_anything_starts(
        keys: Keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = curve_config(keys, data_dir=str(tmp_path / "data"))
    monkeypatch.setattr(zmq, "zmq_version_info", lambda: (4, 3, 1))

    def lock(self: Supervisor) -> None:
        raise AssertionError("the node went on to start: the check must come first")

    monkeypatch.setattr(Supervisor, "_lock", lock)
    with pytest.raises(ConfigError) as info:
        Supervisor(cfg).start()
    assert "4.3.1" in str(info.value) and "4.3.2" in str(info.value)
    assert not (tmp_path / "data").exists()  # no lock taken, no actor spawned, nothing bound
    # Without CURVE that libzmq is not looked at.
    assert curve.server_keys(load_config()) is None
    monkeypatch.setattr(zmq, "zmq_version_info", lambda: (4, 3, 2))
    curve.check_libzmq()


def test_a_libzmq_without_curve_is_refused(keys: Keys, monkeypatch: pytest.MonkeyPatch) -> None:
    real_has = zmq.has
    monkeypatch.setattr(zmq, "has", lambda feature: feature != "curve" and real_has(feature))
    with pytest.raises(ConfigError, match="built without it"):
        curve.server_keys(curve_config(keys))


# ---- a cluster with CURVE: members are each other's clients, by their keys ----------------


def curve_member(root: Path, member: Member, allowed: list[Path], cluster_file: Path,
                 client_keys: tuple[bytes, bytes], server_key: bytes) -> LocalNode:
    """Member ``member`` with its own key pair (``keys-N/node.key``) and an allowed dir
    holding copies of the ``allowed`` public keys."""
    allowed_dir = root / f"allowed-{member.id}"
    allowed_dir.mkdir()
    for pub in allowed:
        (allowed_dir / pub.name).write_bytes(pub.read_bytes())
    config = root / f"node-{member.id}.toml"
    config.write_text(f'[security]\ncurve_secret_key_file = "{root / f"keys-{member.id}" / "node.key"}"\n'
                      f'curve_allowed_keys_dir = "{allowed_dir}"\n')
    return LocalNode(root / f"node-{member.id}", port=member.port, config=config,
                     log_file=root / f"node-{member.id}.log",
                     extra_args=["--cluster", str(cluster_file), "--node-id", str(member.id)],
                     server_public_key=server_key, client_keys=client_keys)


def test_members_forward_to_each_other_as_curve_clients_of_their_keys(tmp_path: Path) -> None:
    """Member 2 forwards a client's reads and writes of member 1's partitions to member 1 as
    a CURVE client with its own key, checked against member 1's allow-list; a routed client
    learns each member's key from the cluster map. A member whose key member 1 does not
    allow cannot have anything forwarded (the catalog member cannot even be asked)."""
    client = keygen(tmp_path / "client-keys", "client")
    pubs = {}
    for m in (1, 2):
        keygen(tmp_path / f"keys-{m}", "node")
        pubs[m] = tmp_path / f"keys-{m}" / f"member-{m}.pub"
        pubs[m].write_bytes((tmp_path / f"keys-{m}" / "node.pub").read_bytes())
    node_keys = {m: read_keypair(tmp_path / f"keys-{m}" / "node.key") for m in (1, 2)}
    members = [Member(m, f"tcp://127.0.0.1:{free_port()}", node_keys[m][0].decode())
               for m in (1, 2)]
    cluster_file = tmp_path / "cluster.toml"
    cluster_file.write_text(cluster_text(members))
    client_pub = tmp_path / "client-keys" / "client.pub"
    nodes = {m.id: curve_member(tmp_path, m, [client_pub, pubs[1], pubs[2]], cluster_file,
                                client, node_keys[m.id][0]) for m in members}
    try:
        for node in nodes.values():
            node.start_process()
        for node in nodes.values():
            node.wait_ready()
        with NodeClient([m.endpoint for m in members], timeout_ms=10_000,
                        server_public_key=node_keys[1][0], client_keys=client) as routed:
            routed.create_topic("sealed", partitions=4)
            owners = routed.owners("sealed")
            assert set(owners) == {1, 2}
            for p in range(4):  # each to its owner, each owner by its own key
                routed.produce("sealed", f"v{p}".encode(), partition=p)
        # A client (its key allowed) under a member's routing id is refused: served as a
        # member, nothing it asked was forwarded; with ROUTER_HANDOVER it could take over a
        # member's connection, and the answers to that member's forwarded requests.
        impostor: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        try:
            impostor.setsockopt(zmq.LINGER, 0)
            impostor.setsockopt(zmq.ROUTING_ID, PEER_PREFIX + b"2-guessed")
            curve.curve_client(impostor, node_keys[1][0], *client)
            impostor.connect(members[0].endpoint)
            impostor.send(pack_map(request_map("list_topics", 7, {})))
            assert impostor.poll(10_000), "no answer"
            (reply,) = protocol.unpack_replies(impostor.recv())
            assert reply["id"] == 7 and reply["code"] == ErrorCode.BAD_REQUEST, reply
            assert "are the cluster members'" in reply["error"], reply
        finally:
            impostor.close()
        first = owners.index(1)
        with NodeClient(members[1].endpoint, timeout_ms=10_000, server_public_key=node_keys[2][0],
                        client_keys=client) as via2:
            via2.produce("sealed", b"forwarded", partition=first)
            assert [r.value for r in via2.read("sealed", first, 0)] == [b"v%d" % first,
                                                                     b"forwarded"]
        # member 1 no longer allows member 2's key: nothing of member 2 gets through
        nodes[1].stop()
        (tmp_path / "allowed-1" / "member-2.pub").unlink()
        nodes[1].start()
        with NodeClient(members[1].endpoint, timeout_ms=3_000, retries=0,
                        server_public_key=node_keys[2][0], client_keys=client) as via2, \
                pytest.raises(NodeError, match="node 1"):
            via2.read("sealed", first, 0)
    finally:
        for node in nodes.values():
            if node.proc is not None:
                node.stop()
