"""Error codes the node answers with, and the exceptions that carry them.

One code per kind of failure a caller can act on. The client raises the subclass that
matches the code, so ``except UnknownTopic`` works on the caller's side.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable numeric codes; the wire carries the number, logs carry the name."""

    BAD_REQUEST = 1  # not msgpack, not a map, wrong or missing field, wrong type
    UNKNOWN_OP = 2
    FRAME_TOO_LARGE = 3
    EMPTY_BATCH = 4
    BATCH_TOO_LARGE = 5
    UNKNOWN_TOPIC = 10
    UNKNOWN_PARTITION = 11
    TOPIC_EXISTS = 12
    INVALID_NAME = 13
    NOT_OWNER = 14  # the partition lives on another member of the cluster (the message names it)
    CROSS_NODE = 15  # a transaction would span members of a cluster (use XA across them)
    OFFSET_OUT_OF_RANGE = 16  # a read below the earliest offset kept (the message names it)
    STALE_SEQUENCE = 20  # a producer sequence number older than the remembered window
    BUSY = 30  # a bounded queue is full; retry later
    TIMEOUT = 31  # the node did not finish the request in time; retry (produce is idempotent)
    UNAVAILABLE = 32  # an actor the request needs is restarting or stopping
    # Local transactions
    TXN_UNKNOWN = 40  # no such transaction (never begun, or finished long ago)
    TXN_STATE = 41  # not allowed in the transaction's state (produce after commit, ...)
    TXN_TIMED_OUT = 42  # open past its timeout: it was rolled back
    TXN_LIMIT = 43  # over a limit of [txn]: open transactions, records or bytes
    TXN_ABORTED = 44  # rolled back: by the node (it restarted before the commit); a commit
    #                   of a transaction already rolled back (its first answer lost) too
    TXN_CONFLICT = 45  # a compare-and-set of the transaction did not match: rolled back
    INTERNAL = 50
    # XA (the X/Open XA specification's names)
    XAER_NOTA = 60  # the xid is not known
    XAER_PROTO = 61  # the call came in the wrong state of the branch
    XAER_DUPID = 62  # the xid is in use already
    XAER_INVAL = 63  # invalid arguments (an xid over 64 bytes, ...)
    XA_RBTIMEOUT = 64  # rolled back: the branch was open past its timeout
    XA_RBROLLBACK = 65  # rolled back by the node for an unspecified reason (a restart)
    XAER_RMERR = 66  # the resource manager failed the call


class NodeError(Exception):
    """An error answered by the node (or by the client on its behalf)."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class BadRequest(NodeError):
    code = ErrorCode.BAD_REQUEST


class UnknownTopic(NodeError):
    code = ErrorCode.UNKNOWN_TOPIC


class UnknownPartition(NodeError):
    code = ErrorCode.UNKNOWN_PARTITION


class TopicExists(NodeError):
    code = ErrorCode.TOPIC_EXISTS


class NotOwner(NodeError):
    """The partition lives on another member: the client refreshes its map and retries."""

    code = ErrorCode.NOT_OWNER


class OffsetOutOfRange(NodeError):
    """A read below the partition's earliest offset still kept; ``earliest`` is that offset
    (the message ends with it: ``... (earliest: N)``)."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE

    @property
    def earliest(self) -> int:
        tail = self.message.rpartition("(earliest: ")[2].rstrip(")")
        return int(tail) if tail.isdigit() else 0


class CrossNode(NodeError):
    """A transaction touched partitions of two members; each member is its own resource
    manager, so coordinate them with XA instead."""

    code = ErrorCode.CROSS_NODE


class StaleSequence(NodeError):
    code = ErrorCode.STALE_SEQUENCE


class Busy(NodeError):
    code = ErrorCode.BUSY


class RequestTimeout(NodeError):
    code = ErrorCode.TIMEOUT


class Unavailable(NodeError):
    code = ErrorCode.UNAVAILABLE


class TransactionError(NodeError):
    """A local transaction's call failed; ``code`` says why (the TXN_* codes)."""

    code = ErrorCode.TXN_STATE


class UnknownTransaction(TransactionError):
    code = ErrorCode.TXN_UNKNOWN


class TransactionTimedOut(TransactionError):
    code = ErrorCode.TXN_TIMED_OUT


class TransactionLimit(TransactionError):
    code = ErrorCode.TXN_LIMIT


class TransactionAborted(TransactionError):
    """The transaction was rolled back, nothing of it is visible: by the node, which
    restarted before its commit, or already (its commit was sent again after a lost
    answer, and it had been rolled back)."""

    code = ErrorCode.TXN_ABORTED


class TransactionConflict(TransactionError):
    """A key's value was not what the transaction's ``kv_cas`` expected at its commit: the
    transaction was rolled back, nothing of it is visible."""

    code = ErrorCode.TXN_CONFLICT


# Its text, the first time and when a commit of the transaction is sent again.
CONFLICT_TEXT = "transaction {}: a key's value was not what its compare-and-set expected; rolled back"


class XAError(NodeError):
    """An XA call failed; ``code`` is the XA specification's error (XAER_*, XA_RB*)."""

    code = ErrorCode.XAER_RMERR


class XAERNota(XAError):
    code = ErrorCode.XAER_NOTA


class XAERProto(XAError):
    code = ErrorCode.XAER_PROTO


class XAERDupid(XAError):
    code = ErrorCode.XAER_DUPID


class XAERInval(XAError):
    code = ErrorCode.XAER_INVAL


class XARBTimeout(XAError):
    code = ErrorCode.XA_RBTIMEOUT


class XARBRollback(XAError):
    code = ErrorCode.XA_RBROLLBACK


_BY_CODE: dict[ErrorCode, type[NodeError]] = {
    ErrorCode.BAD_REQUEST: BadRequest,
    ErrorCode.UNKNOWN_TOPIC: UnknownTopic,
    ErrorCode.UNKNOWN_PARTITION: UnknownPartition,
    ErrorCode.TOPIC_EXISTS: TopicExists,
    ErrorCode.NOT_OWNER: NotOwner,
    ErrorCode.CROSS_NODE: CrossNode,
    ErrorCode.OFFSET_OUT_OF_RANGE: OffsetOutOfRange,
    ErrorCode.STALE_SEQUENCE: StaleSequence,
    ErrorCode.BUSY: Busy,
    ErrorCode.TIMEOUT: RequestTimeout,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.TXN_UNKNOWN: UnknownTransaction,
    ErrorCode.TXN_STATE: TransactionError,
    ErrorCode.TXN_TIMED_OUT: TransactionTimedOut,
    ErrorCode.TXN_LIMIT: TransactionLimit,
    ErrorCode.TXN_ABORTED: TransactionAborted,
    ErrorCode.TXN_CONFLICT: TransactionConflict,
    ErrorCode.XAER_NOTA: XAERNota,
    ErrorCode.XAER_PROTO: XAERProto,
    ErrorCode.XAER_DUPID: XAERDupid,
    ErrorCode.XAER_INVAL: XAERInval,
    ErrorCode.XA_RBTIMEOUT: XARBTimeout,
    ErrorCode.XA_RBROLLBACK: XARBRollback,
    ErrorCode.XAER_RMERR: XAError,
}


def error_for(code: int, message: str) -> NodeError:
    """The exception for a code received on the wire (unknown codes become INTERNAL)."""
    try:
        ec = ErrorCode(code)
    except ValueError:
        return NodeError(f"(code {code}) {message}", ErrorCode.INTERNAL)
    cls = _BY_CODE.get(ec)
    if cls is not None:
        return cls(message)
    if ec in (ErrorCode.UNKNOWN_OP, ErrorCode.FRAME_TOO_LARGE, ErrorCode.EMPTY_BATCH,
              ErrorCode.BATCH_TOO_LARGE, ErrorCode.INVALID_NAME):
        return BadRequest(message, ec)
    return NodeError(message, ec)
