"""The cluster file: the members of a local cluster, each an id and an endpoint.

    # shardnode cluster file: the members (static membership; see docs/ARCHITECTURE.md)
    [[member]]
    id = 1
    endpoint = "tcp://127.0.0.1:7400"

    [[member]]
    id = 2
    endpoint = "tcp://127.0.0.1:7401"
    public_key = "..."      # optional: the member's CURVE public key (Z85), for forwarding

``scripts/cluster up`` writes it; ``shardnode start --cluster FILE --node-id N`` reads it.
Membership is static: a node reads the file once, at start. The member with the lowest id
holds the topic catalog.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from config.schema import ConfigError

MEMBERS_MAX = 64  # members of one cluster
ENDPOINT_RE = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>\d{1,5})$")


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    endpoint: str
    public_key: str = ""

    @property
    def host(self) -> str:
        m = ENDPOINT_RE.match(self.endpoint)
        assert m is not None  # checked when the file was read
        return m["host"].strip("[]")

    @property
    def port(self) -> int:
        m = ENDPOINT_RE.match(self.endpoint)
        assert m is not None
        return int(m["port"])


def parse_members(text: str, where: str) -> tuple[Member, ...]:
    """The members a cluster file's text lists, sorted by id; ``ConfigError`` naming what is
    wrong otherwise."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cluster file {where} is not valid TOML: {exc}") from None
    unknown = set(table) - {"member"}
    if unknown:
        raise ConfigError(f"cluster file {where}: unknown keys {sorted(unknown)}; it lists "
                          f"[[member]] tables only")
    rows = table.get("member")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"cluster file {where} lists no [[member]]")
    if len(rows) > MEMBERS_MAX:
        raise ConfigError(f"cluster file {where} lists {len(rows)} members; at most {MEMBERS_MAX}")
    members: dict[int, Member] = {}
    endpoints: set[str] = set()
    for i, row in enumerate(rows):
        at = f"cluster file {where}, member {i + 1}"
        if not isinstance(row, dict) or set(row) - {"id", "endpoint", "public_key"}:
            raise ConfigError(f"{at}: a member has the keys id, endpoint and (optional) public_key")
        mid, endpoint, key = row.get("id"), row.get("endpoint"), row.get("public_key", "")
        if type(mid) is not int or not 1 <= mid <= 65535:
            raise ConfigError(f"{at}: id must be an integer 1-65535, got {mid!r}")
        if not isinstance(endpoint, str) or not ENDPOINT_RE.match(endpoint):
            raise ConfigError(f"{at}: endpoint must be tcp://HOST:PORT, got {endpoint!r}")
        if not isinstance(key, str) or (key and len(key) != 40):
            raise ConfigError(f"{at}: public_key must be a 40-character Z85 key")
        if mid in members:
            raise ConfigError(f"{at}: id {mid} is listed twice")
        if endpoint in endpoints:
            raise ConfigError(f"{at}: endpoint {endpoint} is listed twice")
        endpoints.add(endpoint)
        members[mid] = Member(mid, endpoint, key)
    return tuple(members[mid] for mid in sorted(members))


@functools.cache
def read_cluster(path: str) -> tuple[Member, ...]:
    """The members of the cluster file at ``path`` (read once per process: membership is
    static)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"cluster file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cluster file {p} cannot be read: {exc}") from None
    return parse_members(text, str(p))


def cluster_text(members: tuple[Member, ...] | list[Member]) -> str:
    """A cluster file listing ``members``."""
    lines = ["# shardnode cluster file: the members (static membership; see docs/ARCHITECTURE.md)",
             "# The member with the lowest id holds the topic catalog."]
    for m in sorted(members, key=lambda m: m.id):
        lines += ["", "[[member]]", f"id = {m.id}", f'endpoint = "{m.endpoint}"']
        if m.public_key:
            lines.append(f'public_key = "{m.public_key}"')
    return "\n".join(lines) + "\n"
