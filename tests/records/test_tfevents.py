#!/usr/bin/env python3
"""Checks tests/records/tfevents.py against event files this script writes itself. The writer
here encodes the protobuf by hand (varints and field keys, no descriptor), so a wrong field
number in the reader's descriptor shows up as a failure instead of cancelling out.

    test_tfevents.py [--workdir DIR]     # default: a fresh temporary directory, removed after

Prints "ok   ..." / "FAIL ..." lines and "N failed"; exit status 1 when any check failed. Needs
google.protobuf (Debian's python3-protobuf, scripts/install_deps.sh): run by an interpreter without
it (e.g. pyenv's), it runs itself again with /usr/bin/python3.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfevents  # noqa: E402

FAILS = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        FAILS.append(msg)
    return cond


# ---- a minimal writer: protobuf wire format by hand, TFRecord framing --------------------------

def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1  # int64 negatives as ten-byte varints
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def ld(field, payload):  # length-delimited (wire type 2)
    return key(field, 2) + varint(len(payload)) + payload


def event(wall_time, step, what):
    return key(1, 1) + struct.pack("<d", wall_time) + key(2, 0) + varint(step) + what


def file_version_event(wall_time, version="brain.Event:2"):
    return event(wall_time, 0, ld(3, version.encode()))


def scalar_event(wall_time, step, tag, value):
    v = ld(1, tag.encode()) + key(2, 5) + struct.pack("<f", value)  # Value.tag = 1, simple_value = 2
    return event(wall_time, step, ld(5, ld(1, v)))  # Event.summary = 5, Summary.value = 1


def session_start_event(wall_time, step, checkpoint=""):
    s = key(1, 0) + varint(1)  # SessionLog.status = START (1)
    if checkpoint:
        s += ld(2, checkpoint.encode())
    return event(wall_time, step, ld(7, s))  # Event.session_log = 7


def frame(data):
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", tfevents.masked_crc32c(n)) + data + struct.pack("<I", tfevents.masked_crc32c(data))


def write(path, events):
    with open(path, "wb") as f:
        for e in events:
            f.write(frame(e))


# ---- checks --------------------------------------------------------------------------------------

def check_crc():
    check(tfevents.crc32c(b"123456789") == 0xE3069283, "crc32c(b'123456789') == 0xE3069283 (the check value)")
    # RFC 3720 (iSCSI) B.4 test vectors for CRC-32C.
    check(tfevents.crc32c(bytes(32)) == 0x8A9136AA, "crc32c(32 zero bytes) == 0x8A9136AA (RFC 3720)")
    check(tfevents.crc32c(b"\xff" * 32) == 0x62A8AB43, "crc32c(32 0xFF bytes) == 0x62A8AB43 (RFC 3720)")
    check(tfevents.crc32c(bytes(range(32))) == 0x46DD794E, "crc32c(0x00..0x1F) == 0x46DD794E (RFC 3720)")
    check(tfevents.crc32c(b"56789", tfevents.crc32c(b"1234")) == 0xE3069283, "crc32c continues across chunks")
    c = 0xE3069283
    check(tfevents.masked_crc32c(b"123456789") == (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF,
          "masked_crc32c = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2^32")


def check_read_and_purge(d):
    run = os.path.join(d, "run")
    os.makedirs(run)
    path = os.path.join(run, "events.out.tfevents.1790000000.n1.1234.0")
    write(path, [
        file_version_event(100.0),
        session_start_event(100.5, 0),            # the session's start: TensorBoard purges nothing
        scalar_event(101.0, 1, "train/lm_loss", 5.5),
        scalar_event(102.0, 2, "train/lm_loss", 5.25),
        session_start_event(103.0, 2, "ckpt/iter_0000001.h5"),  # a restart from iteration 1
        scalar_event(104.0, 2, "train/lm_loss", 5.0),
    ])
    recs = list(tfevents.read_records(path))
    check(len(recs) == 6, f"read_records: 6 records ({len(recs)})")
    evs = list(tfevents.read_events(path))
    check(evs[0].file_version == "brain.Event:2" and evs[0].wall_time == 100.0, "event 1: file_version, wall_time")
    check(evs[2].step == 1 and evs[2].summary.value[0].tag == "train/lm_loss" and evs[2].summary.value[0].simple_value == 5.5,
          "event 3: step 1, tag train/lm_loss, simple_value 5.5")
    check(evs[4].session_log.status == tfevents.SessionLog.START and evs[4].session_log.checkpoint_path == "ckpt/iter_0000001.h5",
          "event 5: SessionLog START with its checkpoint_path")
    check(evs[2].SerializeToString() == scalar_event(101.0, 1, "train/lm_loss", 5.5),
          "the descriptor-built Event serializes to the hand-encoded bytes")
    s = tfevents.scalars(run)
    check(s == {"train/lm_loss": [(1, 5.5, 101.0), (2, 5.0, 104.0)]},
          f"START at step 2 after the first drops step 2 and keeps step 1: {s}")

    # Two files, as two segments write them: the second file's START purges the first file's
    # points at and after its step, in every tag.
    run2 = os.path.join(d, "run2")
    os.makedirs(run2)
    write(os.path.join(run2, "events.out.tfevents.1790000000.n1.1.0"), [
        file_version_event(10.0), session_start_event(10.0, 0)] +
        [scalar_event(10.0 + i, i, "loss", 10.0 - i) for i in range(1, 7)] +
        [scalar_event(10.0 + i, i, "lr", 0.5 * i) for i in range(1, 7)])
    write(os.path.join(run2, "events.out.tfevents.1790003600.n2.1.0"), [
        file_version_event(50.0), session_start_event(50.0, 5, "iter_4")] +
        [scalar_event(50.0 + i, i, "loss", 20.0 - i) for i in range(5, 9)])
    s = tfevents.scalars(run2)
    check([p[0] for p in s.get("loss", [])] == [1, 2, 3, 4, 5, 6, 7, 8] and s["loss"][4][1] == 15.0,
          "two files: loss keeps steps 1-4 of the first, 5-8 of the second")
    check([p[0] for p in s.get("lr", [])] == [1, 2, 3, 4], "two files: the purge also cuts tags the second file never logs")

    # TensorBoard's rule, not a simpler one: a first START that comes after scalars purges nothing.
    run3 = os.path.join(d, "run3")
    os.makedirs(run3)
    write(os.path.join(run3, "events.out.tfevents.1.n1"), [
        file_version_event(1.0), scalar_event(2.0, 1, "x", 1.0), scalar_event(3.0, 2, "x", 2.0),
        session_start_event(4.0, 2), scalar_event(5.0, 2, "x", 3.0)])
    s = tfevents.scalars(run3)
    check([p[0] for p in s.get("x", [])] == [1, 2, 2], "the run's first START purges nothing (TensorBoard since #4763)")

    # Without file_version 2: the older out-of-order rule, per tag.
    run4 = os.path.join(d, "run4")
    os.makedirs(run4)
    write(os.path.join(run4, "events.out.tfevents.1.n1"), [
        scalar_event(1.0, 1, "x", 1.0), scalar_event(1.0, 1, "y", 1.0), scalar_event(2.0, 3, "x", 3.0),
        scalar_event(2.0, 3, "y", 3.0), scalar_event(3.0, 2, "x", 2.5)])
    s = tfevents.scalars(run4)
    check([p[0] for p in s.get("x", [])] == [1, 2] and [p[0] for p in s.get("y", [])] == [1, 3],
          "no file_version: an out-of-order step purges its own tag only")

    # Steps are int64: a step past 2^32 (tokens as the step, say) comes back whole.
    run5 = os.path.join(d, "run5")
    os.makedirs(run5)
    write(os.path.join(run5, "events.out.tfevents.1.n1"), [file_version_event(1.0), scalar_event(2.0, 2**40 + 3, "t", 0.25)])
    s = tfevents.scalars(run5)
    check(s.get("t") == [(2**40 + 3, 0.25, 2.0)], f"an int64 step 2^40 + 3 reads back whole: {s}")
    return path


def expect_error(fn, path, offset, words, what):
    try:
        fn()
    except tfevents.TFEventsError as e:
        msg = str(e)
        return check(path in msg and f"byte offset {offset}:" in msg and all(w in msg for w in words),
                     f"{what}: {msg}")
    return check(False, f"{what}: no error raised")


def check_damage(d, good):
    data = open(good, "rb").read()
    sizes = []
    off = 0
    while off < len(data):
        (n,) = struct.unpack("<Q", data[off:off + 8])
        sizes.append((off, n))
        off += 12 + n + 4
    third_off, third_len = sizes[2]

    def variant(name, blob):
        p = os.path.join(d, name)
        os.makedirs(p)
        f = os.path.join(p, "events.out.tfevents.1.n1")
        with open(f, "wb") as fh:
            fh.write(blob)
        return p, f

    b = bytearray(data)
    b[third_off + 12 + 3] ^= 0x01  # one bit of the third record's data
    p, f = variant("flip_data", bytes(b))
    expect_error(lambda: list(tfevents.read_records(f)), f, third_off, ["bad data CRC"], "a flipped data byte")
    expect_error(lambda: tfevents.scalars(p), f, third_off, ["bad data CRC"], "scalars() reports it too")

    b = bytearray(data)
    b[third_off + 1] ^= 0x10  # the third record's length
    p, f = variant("flip_length", bytes(b))
    expect_error(lambda: list(tfevents.read_records(f)), f, third_off, ["bad length CRC"], "a flipped length byte")

    p, f = variant("cut_data", data[:third_off + 12 + third_len // 2])
    expect_error(lambda: list(tfevents.read_records(f)), f, third_off, ["truncated"], "a file cut inside a record's data")
    p, f = variant("cut_header", data[:third_off + 5])
    expect_error(lambda: list(tfevents.read_records(f)), f, third_off, ["truncated record header"], "a file cut inside a header")
    p, f = variant("cut_crc", data[:third_off + 12 + third_len + 2])
    expect_error(lambda: list(tfevents.read_records(f)), f, third_off, ["truncated"], "a file cut inside the data CRC")
    got = []
    try:
        for r in tfevents.read_records(f):
            got.append(r)
    except tfevents.TFEventsError:
        pass
    check(len(got) == 2, f"the two records before the damage are yielded before the error ({len(got)})")


def main():
    ap = argparse.ArgumentParser(description="Checks tests/records/tfevents.py.")
    ap.add_argument("--workdir", help="directory to write into (emptied first; kept afterwards)")
    a = ap.parse_args()
    if tfevents.Event is None:
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system):
            print(f"# google.protobuf is missing in {sys.executable}: running again with {system}", flush=True)
            return subprocess.run([system, os.path.abspath(__file__), *sys.argv[1:]]).returncode
        check(False, f"google.protobuf imports in {sys.executable} (Debian: python3-protobuf; run with /usr/bin/python3)")
        print(f"{len(FAILS)} failed")
        return 1
    d = a.workdir or tempfile.mkdtemp(prefix="hpct_tfevents_")
    if a.workdir:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    try:
        check_crc()
        good = check_read_and_purge(d)
        check_damage(d, good)
    finally:
        if not a.workdir:
            shutil.rmtree(d, ignore_errors=True)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
