#!/usr/bin/env python3
"""Reads TensorBoard event files (events.out.tfevents.*) as our C++ writer produces them, so tests
can check what TensorBoard will show without TensorFlow or TensorBoard installed. Needs only
python3-protobuf: the messages are built at run time from a FileDescriptorProto carrying
TensorBoard's public field numbers, no .proto files or generated code. Not a general reader: only
the Event fields listed below are decoded; anything else (images, histograms, tensors, summary
metadata) stays an unknown field and is ignored, and a scalar must be a simple_value.

Field numbers, checked against tensorflow/tensorboard tensorboard/compat/proto/event.proto and
summary.proto:
  Event         { double wall_time = 1; int64 step = 2; oneof what { string file_version = 3;
                  bytes graph_def = 4; Summary summary = 5; LogMessage log_message = 6;
                  SessionLog session_log = 7; TaggedRunMetadata tagged_run_metadata = 8;
                  bytes meta_graph_def = 9; } SourceMetadata source_metadata = 10; }
  Summary       { repeated Value value = 1; }
  Summary.Value { string node_name = 7; string tag = 1; oneof value { float simple_value = 2;
                  bytes obsolete_old_style_histogram = 3; ... } }
  SessionLog    { SessionStatus status = 1 (UNSPECIFIED 0, START 1, STOP 2, CHECKPOINT 3);
                  string checkpoint_path = 2; string msg = 3; }

TFRecord framing, per record: uint64 LE length, uint32 LE masked CRC-32C of those 8 bytes, the
data, uint32 LE masked CRC-32C of the data; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8
(mod 2^32). CRC-32C in pure Python (table driven: about 10 MB/s, plenty for scalar logs).

    tfevents.py LOGDIR      # per tag: count, last step, last value (TensorBoard's purge applied)
"""
import os
import struct
import sys

__all__ = ["TFEventsError", "crc32c", "masked_crc32c", "read_records", "read_events", "scalars",
           "Event", "SessionLog", "main"]


class TFEventsError(ValueError):
    """A bad or truncated event file: the message names the file and the byte offset."""


# ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ------------------------------------

def _make_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _make_table()


def crc32c(data, crc=0):
    """CRC-32C of `data` (continuing from `crc`); crc32c(b"123456789") == 0xE3069283."""
    crc ^= 0xFFFFFFFF
    t = _TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The CRC as TFRecord stores it (rotated and offset, so CRCs of CRCs stay useful)."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---- messages, built from a descriptor ---------------------------------------------------------

def _build_messages():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="hpct/tfevents_event.proto", package="tensorboard", syntax="proto3")

    def msg(parent, name):
        m = parent.add()
        m.name = name
        return m

    def field(m, name, number, ftype, type_name=None, repeated=False, oneof=None):
        f = m.field.add(name=name, number=number, type=ftype,
                        label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
        if oneof is not None:
            f.oneof_index = oneof

    def enum(m, name, values):
        e = m.enum_type.add(name=name)
        for k, v in values:
            e.value.add(name=k, number=v)

    summary = msg(fdp.message_type, "Summary")
    value = msg(summary.nested_type, "Value")
    value.oneof_decl.add(name="value")
    field(value, "node_name", 7, F.TYPE_STRING)
    field(value, "tag", 1, F.TYPE_STRING)
    field(value, "simple_value", 2, F.TYPE_FLOAT, oneof=0)
    field(value, "obsolete_old_style_histogram", 3, F.TYPE_BYTES, oneof=0)
    field(summary, "value", 1, F.TYPE_MESSAGE, ".tensorboard.Summary.Value", repeated=True)

    log = msg(fdp.message_type, "LogMessage")
    enum(log, "Level", [("UNKNOWN", 0), ("DEBUGGING", 10), ("INFO", 20), ("WARN", 30), ("ERROR", 40), ("FATAL", 50)])
    field(log, "level", 1, F.TYPE_ENUM, ".tensorboard.LogMessage.Level")
    field(log, "message", 2, F.TYPE_STRING)

    session = msg(fdp.message_type, "SessionLog")
    enum(session, "SessionStatus", [("STATUS_UNSPECIFIED", 0), ("START", 1), ("STOP", 2), ("CHECKPOINT", 3)])
    field(session, "status", 1, F.TYPE_ENUM, ".tensorboard.SessionLog.SessionStatus")
    field(session, "checkpoint_path", 2, F.TYPE_STRING)
    field(session, "msg", 3, F.TYPE_STRING)

    tagged = msg(fdp.message_type, "TaggedRunMetadata")
    field(tagged, "tag", 1, F.TYPE_STRING)
    field(tagged, "run_metadata", 2, F.TYPE_BYTES)

    source = msg(fdp.message_type, "SourceMetadata")
    field(source, "writer", 1, F.TYPE_STRING)

    event = msg(fdp.message_type, "Event")
    event.oneof_decl.add(name="what")
    field(event, "wall_time", 1, F.TYPE_DOUBLE)
    field(event, "step", 2, F.TYPE_INT64)
    field(event, "file_version", 3, F.TYPE_STRING, oneof=0)
    field(event, "graph_def", 4, F.TYPE_BYTES, oneof=0)
    field(event, "summary", 5, F.TYPE_MESSAGE, ".tensorboard.Summary", oneof=0)
    field(event, "log_message", 6, F.TYPE_MESSAGE, ".tensorboard.LogMessage", oneof=0)
    field(event, "session_log", 7, F.TYPE_MESSAGE, ".tensorboard.SessionLog", oneof=0)
    field(event, "tagged_run_metadata", 8, F.TYPE_MESSAGE, ".tensorboard.TaggedRunMetadata", oneof=0)
    field(event, "meta_graph_def", 9, F.TYPE_BYTES, oneof=0)
    field(event, "source_metadata", 10, F.TYPE_MESSAGE, ".tensorboard.SourceMetadata")

    pool = descriptor_pool.DescriptorPool()  # our own pool: no clash with an installed tensorboard
    pool.Add(fdp)

    def cls(name):
        d = pool.FindMessageTypeByName(name)
        if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22 (Python)
            return message_factory.GetMessageClass(d)
        return message_factory.MessageFactory(pool).GetPrototype(d)  # protobuf 3.21 / 4.21

    return cls("tensorboard.Event"), cls("tensorboard.SessionLog")


try:
    Event, SessionLog = _build_messages()
except ImportError as _e:  # keep the CRC and framing usable; say what is missing when decoding
    Event = SessionLog = None
    _IMPORT_ERROR = _e


# ---- records and events ------------------------------------------------------------------------

def _records(path):
    """(byte offset, data) for each record of `path`; TFEventsError on damage or truncation."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TFEventsError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        off = 0
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise TFEventsError(f"{path}: byte offset {off}: truncated record header ({len(head)} of 12 bytes)")
            (length,), (length_crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
            if masked_crc32c(head[:8]) != length_crc:
                raise TFEventsError(f"{path}: byte offset {off}: bad length CRC (stored 0x{length_crc:08x}, "
                                    f"computed 0x{masked_crc32c(head[:8]):08x})")
            if off + 12 + length + 4 > size:
                raise TFEventsError(f"{path}: byte offset {off}: truncated record: {length} data bytes + 4 CRC bytes "
                                    f"announced, {size - off - 12} left in the file")
            data = f.read(length)
            (data_crc,) = struct.unpack("<I", f.read(4))
            if masked_crc32c(data) != data_crc:
                raise TFEventsError(f"{path}: byte offset {off}: bad data CRC (stored 0x{data_crc:08x}, "
                                    f"computed 0x{masked_crc32c(data):08x}) in the record's {length} data bytes")
            yield off, data
            off += 12 + length + 4


def read_records(path):
    """The data of each TFRecord of `path`, in order (bytes). Raises TFEventsError naming the file
    and the record's byte offset on a bad length CRC, a bad data CRC or truncation."""
    for _, data in _records(path):
        yield data


def read_events(path):
    """The Event messages of `path`, in order (TFEventsError as read_records, or for a record that
    does not parse as an Event)."""
    if Event is None:
        raise TFEventsError(f"{path}: cannot decode events: {_IMPORT_ERROR} (Debian: python3-protobuf)")
    from google.protobuf.message import DecodeError
    for off, data in _records(path):
        ev = Event()
        try:
            ev.ParseFromString(data)
        except DecodeError as e:
            raise TFEventsError(f"{path}: byte offset {off}: record is not an Event: {e}") from None
        yield ev


def _file_version(s):
    """TensorBoard's event_util.ParseFileVersion: "brain.Event:2" -> 2.0; -1 when unparsable."""
    try:
        return float(s.split("brain.Event:")[-1])
    except ValueError:
        return -1.0


def _event_files(logdir):
    if os.path.isfile(logdir):
        return [logdir]
    if not os.path.isdir(logdir):
        raise TFEventsError(f"{logdir}: no such directory")
    names = sorted(n for n in os.listdir(logdir) if n.startswith("events.out.tfevents."))
    if not names:
        raise TFEventsError(f"{logdir}: no events.out.tfevents.* files")
    return [os.path.join(logdir, n) for n in names]


def scalars(logdir):
    """{tag: [(step, value, wall_time), ...]} over all events.out.tfevents.* files of `logdir`
    (read in name order, as one run; a single file may be given instead), after the purge that
    TensorBoard applies (tensorboard/backend/event_processing/plugin_event_accumulator.py):

    - once a file_version >= 2 was read ("brain.Event:2"): a SessionLog START event at step S
      drops every scalar read so far with step >= S, in every tag. The FIRST START of the run
      purges nothing (TensorBoard treats it as the session's start, since tensorboard#4763), so a
      writer must log START at every segment start, fresh starts included, and at step R + 1 to
      keep the points of a checkpoint at iteration R;
    - without a file_version >= 2: an event with a summary whose step is below the last summary
      event's step drops, in that event's tags only, the scalars with step >= its step.
    """
    out = {}
    file_version = None
    seen_start = False
    most_recent_step = -1

    def purge(step, tags):
        for t in tags:
            if t in out:
                out[t] = [p for p in out[t] if p[0] < step]

    for path in _event_files(logdir):
        for ev in read_events(path):
            if ev.HasField("file_version"):
                file_version = _file_version(ev.file_version)
            if file_version is not None and file_version >= 2:
                if ev.HasField("session_log") and ev.session_log.status == SessionLog.START:
                    if seen_start:
                        purge(ev.step, list(out))
                    seen_start = True
            elif ev.HasField("summary") and ev.step < most_recent_step:
                purge(ev.step, [v.tag for v in ev.summary.value])
            if ev.HasField("summary"):
                most_recent_step = ev.step
                for v in ev.summary.value:
                    if v.WhichOneof("value") == "simple_value":
                        out.setdefault(v.tag, []).append((ev.step, v.simple_value, ev.wall_time))
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: tfevents.py LOGDIR   (or one events.out.tfevents.* file)\n"
              "Prints each scalar tag with its point count and last step and value, after TensorBoard's purge.",
              file=sys.stderr)
        return 2
    try:
        tags = scalars(argv[0])
    except TFEventsError as e:
        print(f"tfevents.py: error: {e}", file=sys.stderr)
        return 1
    rows = [("tag", "count", "last_step", "last_value")]
    for tag in sorted(tags):
        pts = tags[tag]
        rows.append((tag, str(len(pts)), str(pts[-1][0]) if pts else "-", f"{pts[-1][1]:.6g}" if pts else "-"))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
