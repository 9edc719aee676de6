"""XA transaction ids: ``Xid(format_id, global_id, branch_id)``, and their one printed form.

The XA specification's XID: a format id (an int chosen by the transaction manager) and two
byte strings of at most 64 bytes each, the global transaction id and the branch qualifier.
On the wire an xid is the array ``[format_id, global_id, branch_id]``; printed (by
``shardnode txn list``, in logs and errors) it is ``format_id:global_hex:branch_hex``, the
form ``parse`` reads back, so an operator can paste what the node printed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from wire.errors import ErrorCode, error_for

XID_PART_BYTES_MAX = 64  # the XA specification's MAXGTRIDSIZE and MAXBQUALSIZE
FORMAT_ID_MAX = 2**31 - 1  # a 32-bit signed int in the specification; -1 (null) is refused


class Xid(NamedTuple):
    format_id: int
    global_id: bytes
    branch_id: bytes = b""

    def __str__(self) -> str:
        return f"{self.format_id}:{self.global_id.hex()}:{self.branch_id.hex()}"


def check(value: Any) -> Xid:
    """An xid from its wire form ``[format_id, global_id, branch_id]``; raises ``XAERInval``
    naming what is wrong."""
    if type(value) not in (list, tuple) or len(value) != 3:
        raise error_for(ErrorCode.XAER_INVAL, "an xid is [format_id, global_id, branch_id]")
    fmt, gtrid, bqual = value
    if type(fmt) is not int or not 0 <= fmt <= FORMAT_ID_MAX:
        raise error_for(ErrorCode.XAER_INVAL,
                        f"xid format_id must be an int 0..{FORMAT_ID_MAX}, got {fmt!r}")
    for name, part in (("global_id", gtrid), ("branch_id", bqual)):
        if type(part) is not bytes:
            raise error_for(ErrorCode.XAER_INVAL, f"xid {name} must be bytes")
        if len(part) > XID_PART_BYTES_MAX:
            raise error_for(ErrorCode.XAER_INVAL, f"xid {name} is {len(part)} bytes, over the "
                            f"XA limit of {XID_PART_BYTES_MAX}")
    if not gtrid:
        raise error_for(ErrorCode.XAER_INVAL, "xid global_id must not be empty")
    return Xid(fmt, gtrid, bqual)


def parse(text: str) -> Xid:
    """An xid from its printed form ``format_id:global_hex:branch_hex``."""
    try:
        fmt, gtrid, bqual = text.strip().split(":")
        return check([int(fmt), bytes.fromhex(gtrid), bytes.fromhex(bqual)])
    except ValueError:
        raise error_for(ErrorCode.XAER_INVAL, f"{text!r} is not an xid: format_id:global_hex:"
                        f"branch_hex, as `shardnode txn list` prints it") from None
