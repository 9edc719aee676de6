"""The log manager's logic, with no I/O: what to log for each request, and what to answer.

``LogState`` owns the LSN counter, the topic catalog, the next offset of every shard and
the producers' recent sequence numbers. ``admit`` turns one request into either an
immediate answer (an error, a duplicate's earlier result, the topic list) or a ``Log``
entry: the encoded log record plus the answer to send once the record is durable. The
shell writes a group of pending entries with one write and one fdatasync, then sends
their answers. ``replay`` rebuilds the same state from records read back at recovery.

State changes at admit time, before durability, so that the next request in the same
group sees them; if the write or fsync fails the process exits and recovery rebuilds the
state from what is actually on disk.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

import msgpack

from actors.instructions import Log, Send
from actors.roles import FRONT_DOOR
from actors.txn_ledger import Outcome, TxnLedger
from config import NodeConfig
from wire import formats, logrecord
from wire.codec import Message
from wire.errors import ErrorCode, NodeError
from wire.logrecord import Kind
from wire.messages import (
    ROLLBACK_REASONS,
    Ack,
    AlterTopic,
    Append,
    Catalog,
    CommitOffset,
    CreateTopic,
    DeleteRecord,
    DeleteTopic,
    Done,
    EndOffsets,
    ErrorReply,
    ListTopics,
    LogRequest,
    OffsetRow,
    OffsetsReply,
    PartRow,
    PlacedRow,
    TopicsReply,
    TxnAppend,
    TxnCommitted,
    TxnId,
    TxnOnce,
    TxnPartRow,
    TxnResolve,
    TxnStart,
    TxnWritten,
)
from wire.packer import JOIN_BYTES_MIN, pack
from wire.protocol import ALTERABLE_SETTINGS, KV_PREFIX, NAME_RE, Topic, topic_settings
from wire.xid import Xid

ANSWER_WAIT_MS = 1000  # an answer waits this long for room in the front door's mailbox


def large(parts: Sequence[Sequence[Any]]) -> bool:
    """Whether a record's parts (each ending with its batch of records) carry enough bytes
    to be joined into the log record rather than packed (``wire.logrecord.encode``)."""
    return sum(len(part[-1]) for part in parts) >= JOIN_BYTES_MIN


@dataclass(slots=True)
class ProducerWindow:
    """The recent sequence numbers of one producer and what each one produced."""

    max_seq: int = -1
    low: int = 0  # every sequence number below this has been forgotten
    # seq → msgpack [lsn, parts]: packed once when admitted (about 1 µs), so the window
    # costs little memory and a snapshot packs bytes, not ten thousand small lists.
    results: dict[int, bytes] = field(default_factory=dict)


class LogState:
    def __init__(self, cfg: NodeConfig) -> None:
        lcfg = cfg.log
        assert lcfg.producer_entries_max >= lcfg.producer_window_max, "one full window must fit"
        self.last_lsn = 0
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[int, Topic] = {}
        self.next_topic_id = 1
        self.next_offset: dict[tuple[int, int], int] = {}
        self.producers: collections.OrderedDict[int, ProducerWindow] = collections.OrderedDict()
        self.producers_max = lcfg.producers_max
        self.window = lcfg.producer_window_max
        # Sequence numbers remembered across all windows: the least recently used producers
        # are forgotten beyond this, so memory (and each checkpoint's copy) stays bounded
        # however many producers keep how full a window.
        self.entries_max = lcfg.producer_entries_max
        self.entries = 0
        self.catalog_lsn = 0
        self.shards_max = cfg.limits.shards_max
        self.partitions_max = cfg.limits.partitions_max
        self.txns = TxnLedger(cfg.txn.outcomes_max)
        self.txn_limits = cfg.txn
        self.txns_once = 0  # whole transactions in one request (``once``) logged

    # ---- requests -------------------------------------------------------------------

    def admit(self, msg: LogRequest, now_ms: int) -> Log | Send | None:
        """A record to log (and the answer once it is durable), or an answer to send now;
        None when there is nothing to do or say."""
        out = self._admit(msg, now_ms)
        if out is None or isinstance(out, Log):
            return out
        if getattr(out, "corr", 1) == 0:
            return None  # no one waits for it (a transaction rolled back at its timeout)
        return Send(FRONT_DOOR, out, ANSWER_WAIT_MS)

    def append(self, corr: int, producer_id: int, seq: int, parts: Sequence[PartRow],
               now_ms: int) -> Log | Send:
        """A produce request (the fields of an ``Append``, which ``Writes`` carries bare)."""
        out = self._append(corr, producer_id, seq, parts, now_ms)
        return out if isinstance(out, Log) else Send(FRONT_DOOR, out, ANSWER_WAIT_MS)

    def _admit(self, msg: LogRequest, now_ms: int) -> Log | Message | None:
        match msg:
            case Append(corr, producer_id, seq, parts):
                return self._append(corr, producer_id, seq, parts, now_ms)
            case CreateTopic():
                return self._create(msg)
            case DeleteTopic():
                return self._delete(msg)
            case CommitOffset():
                return self._commit_offset(msg)
            case DeleteRecord():
                return self._delete_record(msg)
            case AlterTopic():
                return self._alter(msg)
            case ListTopics(corr):
                return TopicsReply(corr, sorted(self.topics.values(), key=lambda t: t.name))
            case EndOffsets():
                return self._end_offsets(msg)
            case TxnStart():
                return self._txn_start(msg)
            case TxnAppend():
                return self._txn_append(msg, now_ms)
            case TxnResolve():
                return self._txn_resolve(msg)
            case _:
                assert_never(msg)

    def _producer(self, producer_id: int) -> ProducerWindow:
        win = self.producers.get(producer_id)
        if win is None:
            win = ProducerWindow()
            self.producers[producer_id] = win
            if len(self.producers) > self.producers_max:
                self._forget_oldest()
        else:
            self.producers.move_to_end(producer_id)
        return win

    def _forget_oldest(self) -> None:
        """Forget the least recently used producer: a retry of its would be logged again."""
        _pid, old = self.producers.popitem(last=False)
        self.entries -= len(old.results)

    def _bound_entries(self) -> None:
        # The most recent producer, the one just used, stays: its window alone fits.
        while self.entries > self.entries_max and len(self.producers) > 1:
            self._forget_oldest()

    def _remember(self, win: ProducerWindow, seq: int, lsn: int,
                  parts: Sequence[PlacedRow]) -> None:
        if seq < win.low:
            return  # out of the window already (replayed with a smaller window than logged)
        results = win.results
        before = len(results)
        results[seq] = pack([lsn, parts])
        if seq > win.max_seq:
            win.max_seq = seq
            # Forget the sequence numbers that fell out of the window, (nearly always) the
            # one just below it. Asking the dict for its oldest key instead cost up to
            # O(window): iterating skips the slots its deletions left at the front.
            floor = seq - self.window
            if floor - win.low >= self.window:  # a jump: look at what is there
                for old in [s for s in results if s <= floor]:
                    del results[old]
            else:
                for old in range(win.low, floor + 1):
                    results.pop(old, None)
            win.low = max(win.low, floor + 1)
        # else a gap filled: nothing falls out of the window
        self.entries += len(results) - before
        if self.entries > self.entries_max:
            self._bound_entries()

    def _append(self, corr: int, producer_id: int, seq: int, parts: Sequence[PartRow],
                now_ms: int) -> Log | Message:
        known = self.producers.get(producer_id) if producer_id else None
        if known is not None:
            self.producers.move_to_end(producer_id)  # a retry is use, too
            seen = known.results.get(seq)
            if seen is not None:
                lsn, placed = msgpack.unpackb(seen, use_list=False)
                return Log(b"", Ack(corr, lsn, list(placed)), lsn)  # answered with its group
            if seq <= known.max_seq - self.window:
                return ErrorReply(corr, ErrorCode.STALE_SEQUENCE,
                                  f"sequence {seq} of producer {producer_id} is older "
                                  f"than the last {self.window} remembered (latest {known.max_seq})")
        logged: list[tuple[int, int, int, int, bytes | memoryview]] = []  # as the log record holds them
        acked: list[PlacedRow] = []
        for topic_id, partition, count, blob in parts:
            topic = self.by_id.get(topic_id)
            if topic is None:
                return ErrorReply(corr, ErrorCode.UNKNOWN_TOPIC,
                                  f"topic id {topic_id} does not exist (deleted?)")
            if not 0 <= partition < topic.partitions:
                return ErrorReply(corr, ErrorCode.UNKNOWN_PARTITION,
                                  f"topic {topic.name!r} has no partition {partition}")
            first = self.next_offset[(topic_id, partition)]
            logged.append((topic_id, partition, first, count, blob))
            acked.append((partition, first, count))
        # Only a request that is going to be logged touches producer state: a refused one
        # must not evict another producer's window.
        # Producer id 0 is never de-duplicated (a KV write whose client sent no producer).
        win = self._producer(producer_id) if producer_id else None
        for (topic_id, partition, first, count, _blob) in logged:
            self.next_offset[(topic_id, partition)] = first + count
        self.last_lsn += 1
        lsn = self.last_lsn
        record = logrecord.encode(lsn, Kind.PRODUCE, [producer_id, seq, now_ms, logged],
                                  large=large(logged))
        if win is not None:
            self._remember(win, seq, lsn, acked)
        return Log(record, Ack(corr, lsn, acked), lsn)

    def _create(self, msg: CreateTopic) -> Log | Message:
        name = msg.name.removeprefix(KV_PREFIX)  # a KV namespace's topic: kv:<name>
        if not NAME_RE.match(name):
            return ErrorReply(msg.corr, ErrorCode.INVALID_NAME,
                              f"topic name {msg.name!r} must be 1-200 letters, digits, '.', '_' "
                              f"or '-', starting with a letter or digit")
        if not 1 <= msg.partitions <= self.partitions_max:
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"partitions must be 1-{self.partitions_max} "
                              f"(limits.partitions_max), got {msg.partitions}")
        owners = tuple(msg.owners)
        if owners and len(owners) != msg.partitions:
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"{len(owners)} owners for {msg.partitions} partitions")
        have = self.topics.get(msg.name)
        if msg.topic_id:  # a member copying the catalog member's topic: done once
            if have is not None and have.topic_id == msg.topic_id:
                return Done(msg.corr, self.catalog_lsn)
            if have is not None or msg.topic_id in self.by_id:
                return ErrorReply(msg.corr, ErrorCode.TOPIC_EXISTS,
                                  f"topic {msg.name!r} (id {msg.topic_id}) clashes with topic "
                                  f"{(have or self.by_id[msg.topic_id]).name!r} here")
        elif have is not None:
            return ErrorReply(msg.corr, ErrorCode.TOPIC_EXISTS, f"{_named(msg.name)} exists")
        else:
            refused = self._over_shards(msg.partitions, owners)
            if refused:
                return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST, refused)
        self.last_lsn += 1
        topic = Topic(msg.name, msg.partitions, msg.topic_id or self.next_topic_id, owners,
                      dict(msg.settings))
        self._apply_create(topic, self.last_lsn)
        body: list[Any] = [topic.topic_id, topic.name, topic.partitions, list(owners)]
        if msg.settings:
            body.append(dict(msg.settings))
        return self._done(msg.corr, Kind.TOPIC_CREATE, body, catalog_changed=True)

    def _done(self, corr: int, kind: Kind, body: list[Any], catalog_changed: bool = False
              ) -> Log:
        """The record of ``kind`` at ``last_lsn`` (the caller took it), answered ``Done``
        once it is durable."""
        record = logrecord.encode(self.last_lsn, kind, body)
        return Log(record, Done(corr, self.last_lsn), self.last_lsn,
                   catalog_changed=catalog_changed)

    def _over_shards(self, partitions: int, owners: tuple[int, ...]) -> str:
        """Why a new topic would pass ``limits.shards_max`` on a member (this node, or in a
        cluster any member: the catalog member sees every topic's placement), or ""."""
        if not owners:
            shards = sum(t.partitions for t in self.topics.values())
            if shards + partitions > self.shards_max:
                return (f"the node has {shards} partitions; {partitions} more would pass "
                        f"limits.shards_max = {self.shards_max}")
            return ""
        held = collections.Counter(o for t in self.topics.values() for o in t.owners)
        for member, count in sorted(collections.Counter(owners).items()):
            if held[member] + count > self.shards_max:
                return (f"member {member} has {held[member]} partitions; {count} more would "
                        f"pass limits.shards_max = {self.shards_max}")
        return ""

    def _delete(self, msg: DeleteTopic) -> Log | Message:
        topic = self.topics.get(msg.name)
        if msg.topic_id and (topic is None or topic.topic_id != msg.topic_id):
            return Done(msg.corr, self.catalog_lsn)  # gone already: deleting is done once
        if topic is None:
            return ErrorReply(msg.corr, ErrorCode.UNKNOWN_TOPIC,
                              f"{_named(msg.name)} does not exist")
        self.last_lsn += 1
        self._apply_delete(topic.topic_id, self.last_lsn)
        return self._done(msg.corr, Kind.TOPIC_DELETE, [topic.topic_id, topic.name],
                          catalog_changed=True)

    def _alter(self, msg: AlterTopic) -> Log | Message:
        topic = self.topics.get(msg.name)
        if topic is None or (msg.topic_id and topic.topic_id != msg.topic_id):
            return ErrorReply(msg.corr, ErrorCode.UNKNOWN_TOPIC, f"topic {msg.name!r} does not exist")
        if msg.topic_id:  # a member copying the catalog member's settings: whole
            settings = dict(msg.settings)
        else:
            fixed = sorted(set(msg.settings) - set(ALTERABLE_SETTINGS))
            if fixed:
                return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                                  f"{fixed} cannot be changed; alter_topic changes "
                                  f"{list(ALTERABLE_SETTINGS)}")
            try:
                settings = topic_settings({**topic.settings, **msg.settings})
            except NodeError as exc:
                return ErrorReply(msg.corr, exc.code, exc.message)
        if settings == topic.settings:
            return Done(msg.corr, self.catalog_lsn)  # nothing changes: nothing logged
        self.last_lsn += 1
        self._apply_alter(topic.topic_id, settings, self.last_lsn)
        return self._done(msg.corr, Kind.TOPIC_ALTER, [topic.topic_id, topic.name, settings],
                          catalog_changed=True)

    def _partition(self, corr: int, topic_id: int, partition: int) -> Topic | ErrorReply:
        """The topic of an existing partition, or the error that says it does not exist."""
        topic = self.by_id.get(topic_id)
        if topic is None:
            return ErrorReply(corr, ErrorCode.UNKNOWN_TOPIC, f"topic id {topic_id} does not exist")
        if not 0 <= partition < topic.partitions:
            return ErrorReply(corr, ErrorCode.UNKNOWN_PARTITION,
                              f"topic {topic.name!r} has no partition {partition}")
        return topic

    def _delete_record(self, msg: DeleteRecord) -> Log | Message:
        topic = self._partition(msg.corr, msg.topic_id, msg.partition)
        if isinstance(topic, ErrorReply):
            return topic
        end = self.next_offset[(msg.topic_id, msg.partition)]
        if msg.offset >= end:
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"offset {msg.offset} of {topic.name}/{msg.partition} was never "
                              f"written (the next is {end})")
        self.last_lsn += 1
        return self._done(msg.corr, Kind.DELETE, [msg.topic_id, msg.partition, msg.offset, msg.key])

    def _commit_offset(self, msg: CommitOffset) -> Log | Message:
        topic = self._partition(msg.corr, msg.topic_id, msg.partition)
        if isinstance(topic, ErrorReply):
            return topic
        # (A memory topic's records are not logged: its end is not known here.)
        if (topic.storage != "memory"
                and not 0 <= msg.offset <= self.next_offset[(msg.topic_id, msg.partition)]):
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"offset {msg.offset} is past the end of {topic.name}/{msg.partition}")
        self.last_lsn += 1
        return self._done(msg.corr, Kind.OFFSET_COMMIT,
                          [msg.group, msg.topic_id, msg.partition, msg.offset])

    def _end_offsets(self, msg: EndOffsets) -> Log | Message:
        topic = self.by_id.get(msg.topic_id)
        if topic is None:
            return ErrorReply(msg.corr, ErrorCode.UNKNOWN_TOPIC, f"topic id {msg.topic_id} does not exist")
        offsets = [self.next_offset[(topic.topic_id, p)] for p in range(topic.partitions)]
        # Nothing to write: the answer goes with the next group commit, so that every
        # record below these offsets is durable when it arrives.
        return Log(b"", OffsetsReply(msg.corr, self.last_lsn, offsets), self.last_lsn)

    # ---- transactions (the ledger: actors/txn_ledger.py) ----------------------------

    def _txn_start(self, msg: TxnStart) -> Log | Message:
        if msg.txn in self.txns.open or msg.txn in self.txns.outcomes:
            return ErrorReply(msg.corr, ErrorCode.TXN_STATE, f"transaction {msg.txn} exists")
        self.last_lsn += 1
        if msg.xid is None:
            record = logrecord.encode(self.last_lsn, Kind.TX_START, [msg.txn])
            xid = None
        else:
            xid = Xid(*msg.xid)
            record = logrecord.encode(self.last_lsn, Kind.DTX_START, [msg.txn, *xid])
        self.txns.start(msg.txn, xid, self.last_lsn)
        # Answered once durable, never early: a client must not hold an id the log could
        # lose, as the next transaction manager hands out ids from above the log's
        # (``Transactions.sync``): it would give the same id to another client.
        return Log(record, TxnId(msg.corr, msg.txn) if msg.corr else None, self.last_lsn)

    def _txn_append(self, msg: TxnAppend, now_ms: int) -> Log | Message:
        st = self.txns.open.get(msg.txn)
        if st is None or st.prepared:
            return ErrorReply(msg.corr, ErrorCode.TXN_STATE,
                              f"transaction {msg.txn} is not open in the log")
        refused = self._bad_offsets(msg.corr, msg.offsets)
        if refused is not None:
            return refused
        return self._stage(msg, now_ms)

    def _stage(self, msg: TxnAppend, now_ms: int) -> Log:
        """Log a write of an open transaction whose offsets were checked."""
        # A topic deleted since the front door checked: its part is dropped, as the topic's
        # records would be at its deletion.
        parts = [row for row in msg.parts if row[0] in self.by_id
                 and 0 <= row[1] < self.by_id[row[0]].partitions]
        self.last_lsn += 1
        self.txns.write(msg.txn, parts, msg.offsets)
        record = logrecord.encode(self.last_lsn, Kind.TXN_WRITE,
                                  [msg.txn, now_ms, parts, msg.offsets], large=large(parts))
        return Log(record, TxnWritten(msg.corr, self.last_lsn, self.txns.open[msg.txn].records),
                   self.last_lsn, early=True)

    def _bad_offsets(self, corr: int, offsets: Sequence[OffsetRow]) -> ErrorReply | None:
        """Why consumer offsets staged in a transaction are refused, or None."""
        for group, topic_id, partition, offset in offsets:
            end = self.next_offset.get((topic_id, partition))
            if end is None:
                return ErrorReply(corr, ErrorCode.UNKNOWN_TOPIC,
                                  f"topic id {topic_id} partition {partition} does not exist")
            if offset > end and self.by_id[topic_id].storage != "memory":
                return ErrorReply(corr, ErrorCode.BAD_REQUEST,
                                  f"offset {offset} of group {group!r} is past the end "
                                  f"({end}) of the partition")
        return None

    def once(self, msg: TxnOnce, now_ms: int) -> list[Log] | Send:
        """A whole transaction (``txn_once``): its start, its writes and its commit, logged
        as the three records ``txn_begin``, a write and ``txn_commit`` log (recovery, the
        shard writers and checkpoints see nothing new) and answered once the commit is
        durable. A crash between them (they may fall into two group commits) leaves an open
        transaction that was never answered: the supervisor restarts the transaction manager
        with the log manager, and its ``TxnSync`` rolls back every open one (``abort_open``);
        the client's retry is then told so (TXN_ABORTED).

        It is checked here, not by the transaction manager: it is never open between two
        messages, so there is nothing for that one to hold, time out or recover, and the
        ledger here has what a retry needs (the outcome) and what an id in use needs. It
        takes the route of writes (``actors.roles.writes_role``): through the transaction
        manager only when a blocking checkpoint's gate must see it."""
        txn, corr = msg.txn, msg.corr
        done = self.txns.outcomes.get(txn)
        if done is not None and done.committed:  # a retry after a lost answer
            return [Log(b"", TxnCommitted(corr, done.lsn, done.parts), done.lsn)]
        refused: ErrorReply | None
        if done is not None:  # sent again after a crash lost its commit: rolled back since
            refused = ErrorReply(corr, ErrorCode.TXN_ABORTED, (
                f"transaction {txn} was rolled back: the node restarted before its commit "
                f"was durable; nothing of it is visible (send it again with a new id)"))
        elif txn in self.txns.open:
            refused = ErrorReply(corr, ErrorCode.TXN_STATE,
                                 f"transaction id {txn} is in use; pick another")
        else:
            refused = self._once_refusal(msg)
        if refused is not None:
            return Send(FRONT_DOOR, refused, ANSWER_WAIT_MS)
        start = self._txn_start(TxnStart(0, txn, None))
        write = self._stage(TxnAppend(0, txn, msg.parts, msg.offsets), now_ms)  # offsets checked
        commit = self._txn_resolve(TxnResolve(corr, txn, "commit"))
        assert isinstance(start, Log) and isinstance(commit, Log)
        write.reply, write.early = None, False
        self.txns_once += 1
        return [start, write, commit]

    def _once_refusal(self, msg: TxnOnce) -> ErrorReply | None:
        """Why a whole transaction is refused (the limits ``[txn]`` sets), or None."""
        records = sum(row[2] for row in msg.parts)
        nbytes = sum(len(row[3]) for row in msg.parts)
        lim = self.txn_limits
        if msg.txn == 0:
            text = "txn_once needs the transaction's id (a client's pick, not 0)"
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST, text)
        if records > lim.records_max:
            text = f"{records} records would pass txn.records_max = {lim.records_max}"
        elif nbytes > lim.bytes_max:
            text = f"{nbytes} bytes would pass txn.bytes_max = {lim.bytes_max}"
        else:
            return self._bad_offsets(msg.corr, msg.offsets)
        return ErrorReply(msg.corr, ErrorCode.TXN_LIMIT, f"transaction {msg.txn}: {text}")

    def _txn_resolve(self, msg: TxnResolve) -> Log | Message | None:
        txn, corr = msg.txn, msg.corr
        done = self.txns.outcomes.get(txn)
        if done is not None:  # a retry after a lost answer: the first outcome again
            if msg.step == "commit" and done.committed:
                return Log(b"", TxnCommitted(corr, done.lsn, done.parts), done.lsn)
            if msg.step == "rollback" and not done.committed:
                return Log(b"", Done(corr, done.lsn), done.lsn)
            return ErrorReply(corr, ErrorCode.TXN_STATE, f"transaction {txn} was "
                              f"{'committed' if done.committed else 'rolled back'} already")
        st = self.txns.open.get(txn)
        if st is None:
            return ErrorReply(corr, ErrorCode.TXN_UNKNOWN, f"transaction {txn} is not in the "
                              f"log (finished long ago, or rolled back at a restart)")
        self.last_lsn += 1
        lsn = self.last_lsn
        reply: Message | None
        if msg.step == "prepare":
            self.txns.prepare(txn)
            record = logrecord.encode(lsn, Kind.PREPARE, [txn])
            reply = Done(corr, lsn)
        elif msg.step == "commit":
            placed, rows = self._place(st.counts)
            offsets = [[g, t, p, o] for (g, t, p), o in st.offsets.items()
                       if (t, p) in self.next_offset]
            record = logrecord.encode(lsn, Kind.COMMIT, [txn, placed, offsets])
            self.txns.finish(txn, Outcome(True, lsn, rows, st.xid))
            reply = TxnCommitted(corr, lsn, rows)
        else:
            assert msg.reason in ROLLBACK_REASONS, msg  # said by the transaction manager
            record = logrecord.encode(lsn, Kind.ROLLBACK,
                                      [txn, [[t, p] for t, p in st.counts], msg.reason])
            self.txns.finish(txn, Outcome(False, lsn, [], st.xid, reason=msg.reason))
            reply = Done(corr, lsn)
        return Log(record, reply if corr else None, lsn)

    def abort_open(self) -> tuple[list[Log], list[int]]:
        """Roll back every open transaction that is not prepared: the transaction manager
        (re)started, and their clients may have lost writes in flight. Done here, in the
        order of the log manager's mailbox, so that a commit still on its way from before
        the restart either came first (and stands) or is refused after."""
        logs: list[Log] = []
        aborted: list[int] = []
        for txn in [t for t, st in self.txns.open.items() if not st.prepared]:
            out = self._txn_resolve(TxnResolve(0, txn, "rollback", "restart"))
            assert isinstance(out, Log)
            logs.append(out)
            aborted.append(txn)
        return logs, aborted

    def _place(self, counts: dict[tuple[int, int], int]
               ) -> tuple[list[list[int]], list[TxnPartRow]]:
        """Offsets for a commit's records: contiguous in each shard, from its next offset.
        Shards of topics deleted since are left out (their records went with the topic)."""
        placed: list[list[int]] = []
        rows: list[TxnPartRow] = []
        for (topic_id, partition), count in counts.items():
            first = self.next_offset.get((topic_id, partition))
            if first is None or count == 0:
                continue
            self.next_offset[(topic_id, partition)] = first + count
            placed.append([topic_id, partition, first, count])
            rows.append((self.by_id[topic_id].name, partition, first, count))
        return placed, rows

    def _replay_txn(self, entry: logrecord.Entry) -> None:
        kind, lsn = entry.kind, entry.lsn
        if kind == Kind.TXN_WRITE:
            txn, _ts, parts, offsets = entry.body()
            if txn in self.txns.open:
                self.txns.write(txn, parts, offsets)
            return
        body = entry.body()
        txn = body[0]
        if kind == Kind.TX_START:
            self.txns.start(txn, None, lsn)
        elif kind == Kind.DTX_START:
            self.txns.start(txn, Xid(*body[1:]), lsn)
        elif kind == Kind.PREPARE:
            if txn in self.txns.open:
                self.txns.prepare(txn)
        elif kind == Kind.COMMIT:
            rows: list[TxnPartRow] = []
            for topic_id, partition, first, count in body[1]:
                key = (topic_id, partition)
                if key in self.next_offset:
                    self.next_offset[key] = first + count
                    rows.append((self.by_id[topic_id].name, partition, first, count))
            self.txns.finish(txn, Outcome(True, lsn, rows, self.txns.xid_of(txn)))
        else:  # ROLLBACK (its reason from log format 3 on)
            self.txns.finish(txn, Outcome(False, lsn, [], self.txns.xid_of(txn),
                                          reason=body[2] if len(body) > 2 else ""))

    # ---- catalog --------------------------------------------------------------------

    def _apply_create(self, topic: Topic, lsn: int) -> None:
        self.topics[topic.name] = topic
        self.by_id[topic.topic_id] = topic
        self.next_topic_id = max(self.next_topic_id, topic.topic_id + 1)
        for p in range(topic.partitions):
            self.next_offset[(topic.topic_id, p)] = 0
        self.catalog_lsn = lsn

    def _apply_delete(self, topic_id: int, lsn: int) -> None:
        topic = self.by_id.pop(topic_id, None)
        if topic is not None:
            del self.topics[topic.name]
            for p in range(topic.partitions):
                self.next_offset.pop((topic_id, p), None)
        self.catalog_lsn = lsn

    def _apply_alter(self, topic_id: int, settings: dict[str, Any], lsn: int) -> None:
        topic = self.by_id.get(topic_id)
        if topic is not None:
            topic = topic._replace(settings=settings)
            self.by_id[topic_id] = self.topics[topic.name] = topic
        self.catalog_lsn = lsn

    def catalog(self) -> Catalog:
        return Catalog(self.catalog_lsn, list(self.by_id.values()), self.catalog_lsn)

    # ---- snapshots ------------------------------------------------------------------

    # The versions, and what each holds: wire/formats.py (SNAPSHOT).
    SNAPSHOT_FORMAT = formats.SNAPSHOT.current
    SNAPSHOT_FORMATS_READ = formats.SNAPSHOT.reads

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to go on from ``last_lsn`` without the records before it.

        Cheap to take (copies, no per-entry Python work), so the log manager can take it
        between two group commits and encode and write it on another thread: each window
        is a copy of its dict of packed entries, which msgpack writes as a map (in order,
        oldest first)."""
        return {
            "format": self.SNAPSHOT_FORMAT,
            "last_lsn": self.last_lsn,
            "catalog_lsn": self.catalog_lsn,
            "next_topic_id": self.next_topic_id,
            "topics": [[t.topic_id, t.name, t.partitions, list(t.owners),
                        *([dict(t.settings)] if t.settings else [])]
                       for t in self.by_id.values()],
            "next_offset": [[tid, p, off] for (tid, p), off in self.next_offset.items()],
            "producers": [[pid, w.max_seq, w.results.copy()] for pid, w in self.producers.items()],
            **self.txns.snapshot(),
        }

    def restore(self, snap: dict[str, Any]) -> None:
        form = snap.get("format")
        if form not in self.SNAPSHOT_FORMATS_READ:  # checked by wal.load_snapshot too
            raise ValueError(f"snapshot format {form} is not one of {self.SNAPSHOT_FORMATS_READ}")
        self.last_lsn = snap["last_lsn"]
        self.catalog_lsn = snap["catalog_lsn"]
        self.next_topic_id = snap["next_topic_id"]
        self.topics.clear()
        self.by_id.clear()
        for tid, name, parts, *rest in snap["topics"]:  # owners: since clusters; settings
            topic = Topic.from_row([name, parts, tid, *rest])
            self.topics[name] = topic
            self.by_id[tid] = topic
        self.next_offset = {(tid, p): off for tid, p, off in snap["next_offset"]}
        self.producers.clear()
        for pid, max_seq, window in snap["producers"]:
            low = max(0, max_seq - self.window + 1)
            self.producers[pid] = ProducerWindow(max_seq, low,
                                                 {s: r for s, r in window.items() if s >= low})
        # Oldest first, as they were: a smaller bound than the snapshot's forgets the oldest.
        self.entries = sum(len(w.results) for w in self.producers.values())
        while len(self.producers) > self.producers_max:
            self._forget_oldest()
        self._bound_entries()
        self.txns.restore(snap)

    # ---- recovery -------------------------------------------------------------------

    def replay(self, entry: logrecord.Entry) -> None:
        """Apply one record read back from the log (in LSN order)."""
        if entry.lsn <= self.last_lsn:
            raise ValueError(f"record LSN {entry.lsn} replayed after {self.last_lsn}")
        self.last_lsn = entry.lsn
        kind = entry.kind
        if kind == Kind.PRODUCE:
            producer_id, seq, _ts, parts = msgpack.unpackb(entry.payload, raw=False)
            acked: list[PlacedRow] = []
            for topic_id, partition, first, count, _blob in parts:
                key = (topic_id, partition)
                if key in self.next_offset:
                    self.next_offset[key] = first + count
                acked.append((partition, first, count))
            if producer_id:  # producer id 0 is never de-duplicated
                self._remember(self._producer(producer_id), seq, entry.lsn, acked)
        elif kind == Kind.TOPIC_CREATE:
            topic_id, name, partitions, *rest = entry.body()  # owners: since clusters
            self._apply_create(Topic.from_row([name, partitions, topic_id, *rest]), entry.lsn)
        elif kind == Kind.TOPIC_DELETE:
            topic_id, _name = entry.body()
            self._apply_delete(topic_id, entry.lsn)
        elif kind == Kind.TOPIC_ALTER:
            topic_id, _name, settings = entry.body()
            self._apply_alter(topic_id, settings, entry.lsn)
        elif kind in (Kind.OFFSET_COMMIT, Kind.DELETE):
            pass  # applied by the shard writers; nothing for the log manager to remember
        elif Kind.TX_START <= kind <= Kind.ROLLBACK:
            self._replay_txn(entry)
        else:
            raise ValueError(f"unknown record kind {kind} at LSN {entry.lsn}")


def _named(topic: str) -> str:
    """A topic as its user knows it: a KV namespace by its own name, not its topic's."""
    if topic.startswith(KV_PREFIX):
        return f"KV namespace {topic.removeprefix(KV_PREFIX)!r}"
    return f"topic {topic!r}"
