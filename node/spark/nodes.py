"""The node, or the cluster, that the option ``endpoint`` names, as the data source reaches it.

``endpoint`` names a single node, or a cluster: several of its members, comma-separated, or
just one of them. ``Nodes`` asks the first that answers for the cluster's members
(``cluster_map``). A node with none is a single node, member ``SINGLE`` (0), sent every
request. A cluster is reached through a client routed by its map (``NodeClient`` given the
members: each partition's requests go to its owner, topics are made on the catalog member,
a decision topic's record to its partition's owner) and, for what lives on one member (an
XA branch, the list of its transactions), a plain client of that member (``member``).

``check_start`` asks the node, within bounds of its own, whether it answers and has the
query's topic, as a query starts on the driver.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from node.client import NodeClient
from node.spark.options import OptionError
from wire.errors import ErrorCode, RequestTimeout, Unavailable, UnknownTopic, error_for

SINGLE = 0  # the member id of a single node (its ``cluster_map`` answers node_id 0)
# A query's start asks the node (``check_start``) with its own bounds: a node that does not
# answer fails the query within about (START_RETRIES + 1) * START_TIMEOUT_MS_MAX for each
# endpoint, not in the six ``requestTimeoutMs`` (3 minutes by default) of a task's request.
START_TIMEOUT_MS_MAX = 5000
START_RETRIES = 1
# PySpark makes a stream's writer again for each micro-batch's commit: a check that passed
# is not made again in this process for this long, so that a stream pays for it about once
# a minute, not twice a batch. At most CHECKED_MAX are remembered.
CHECKED_FOR_S = 60.0
CHECKED_MAX = 256
_checked: dict[tuple[tuple[str, ...], str | None, bool], float] = {}


class Nodes:
    """The clients of a node or a cluster, for one task or one call of the driver: a
    context manager that closes them."""

    def __init__(self, endpoints: Sequence[str], timeout_ms: int, retries: int = 5) -> None:
        assert endpoints, "options.endpoints_of gives at least one"
        self.timeout_ms, self.retries = timeout_ms, retries
        first = endpoints[0] if len(endpoints) == 1 else list(endpoints)
        client = NodeClient(first, timeout_ms=timeout_ms, retries=retries)
        try:
            members = client.members()
            if not members and len(endpoints) > 1:
                raise OptionError(f"option 'endpoint' names {len(endpoints)} endpoints, but "
                                  f"the one that answered is a single node, not a member of a "
                                  f"cluster")
        except BaseException:
            client.close()
            raise
        if len(endpoints) == 1 and len(members) > 1:
            # One member named: route by the map it answered, asking it first.
            client.close()
            given = endpoints[0]
            client = NodeClient([given, *(e for e in members.values() if e != given)],
                                timeout_ms=timeout_ms, retries=retries)
        self.client = client
        self.members = members or {SINGLE: endpoints[0]}
        self._plain: dict[int, NodeClient] = {}

    @property
    def cluster(self) -> bool:
        return SINGLE not in self.members

    def owners(self, topic: str) -> tuple[int, ...]:
        """The member owning each partition of ``topic`` (a cluster's)."""
        assert self.cluster, "a single node owns every partition"
        return self.client.owners(topic)

    def member(self, member: int) -> NodeClient:
        """A plain client of one member (of the node, for a single node's ``SINGLE``)."""
        client = self._plain.get(member)
        if client is not None:
            return client
        endpoint = self.members.get(member)
        if endpoint is None:
            raise error_for(ErrorCode.UNAVAILABLE, f"node {member} is not a member of the "
                            f"cluster (its members: {sorted(self.members)})")
        if not self.client.routed and endpoint == self.client.endpoint:
            client = self.client
        else:
            client = NodeClient(endpoint, timeout_ms=self.timeout_ms, retries=self.retries)
        self._plain[member] = client
        return client

    def name(self, member: int) -> str:
        """A member as messages name it."""
        endpoint = self.members.get(member, "?")
        return endpoint if member == SINGLE else f"node {member} ({endpoint})"

    def close(self) -> None:
        for client in self._plain.values():
            if client is not self.client:
                client.close()
        self.client.close()

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_start(endpoints: Sequence[str], timeout_ms: int, topic: str | None,
                staged: bool = False) -> None:
    """On the driver, as a query starts (the data source makes its reader or writer there):
    the node, or the cluster, answers, and ``topic`` (when an option names it) exists, and
    is not a memory topic when the query ``staged`` its rows in transactions (exactly once),
    so that none of them fails every task later. Raises ``UnknownTopic`` saying to create
    the topic, ``OptionError``, or the client's ``Unavailable`` or ``RequestTimeout`` naming
    the endpoints. Two requests: the cluster's members and its topics (of the catalog
    member)."""
    what = (tuple(endpoints), topic, staged)
    now = time.monotonic()
    if now < _checked.get(what, 0.0):
        return
    try:
        with Nodes(endpoints, min(timeout_ms, START_TIMEOUT_MS_MAX), START_RETRIES) as nodes:
            if topic is not None:
                # Routed: the catalog member's list.
                info = {t.name: t for t in nodes.client.list_topics()}.get(topic)
                if info is None:
                    raise UnknownTopic(f"topic {topic!r} does not exist")
                if staged and info.storage == "memory":
                    raise OptionError(f"topic {topic!r} is a memory topic: its records are "
                                      f"not logged, so they take no part in transactions; "
                                      f"write it with option deliveryGuarantee "
                                      f"'at_least_once'")
        if len(_checked) >= CHECKED_MAX:
            _checked.clear()
        _checked[what] = now + CHECKED_FOR_S
    except UnknownTopic:
        assert topic is not None
        raise _missing_topic(topic, endpoints) from None
    except (Unavailable, RequestTimeout) as exc:  # HandshakeFailed too: its type is kept
        raise type(exc)(f"the shardnode data source could not reach {', '.join(endpoints)} "
                        f"(option 'endpoint') as the query started: {exc.message}") from None


def _missing_topic(topic: str, endpoints: Sequence[str]) -> UnknownTopic:
    """The error of a topic that does not exist, with the command that creates it (through
    any member of a cluster: it is made on the catalog member)."""
    url = urlsplit(endpoints[0])
    try:
        where = f" --host {url.hostname} --port {url.port}" if url.hostname and url.port else ""
    except ValueError:  # not a port: the node answered, so the endpoint is not plain tcp
        where = ""
    return UnknownTopic(f"topic {topic!r} does not exist on {', '.join(endpoints)}: create it "
                        f"first, e.g. `shardnode create-topic {shlex.quote(topic)}{where} "
                        f"--partitions N` (or NodeClient.create_topic)")
