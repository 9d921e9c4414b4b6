"""Zero copy through the buffer protocol: read-only messages, the write phase, lifetimes."""

from __future__ import annotations

import ctypes
import gc

import pytest

import ferry


def send_array(pair, np, shape=(1080, 1920, 3), value=7):
    buf = pair.path.alloc(int(np.prod(shape)))
    arr = np.frombuffer(buf, dtype=np.uint8).reshape(shape)
    arr[...] = value
    del arr
    msg = buf.freeze()
    pair.tx.send(msg)
    return msg


def test_received_message_is_read_only(pair, np):
    send_array(pair, np)
    got = pair.rx.recv(timeout=5)
    img = np.frombuffer(got, dtype=np.uint8).reshape(1080, 1920, 3)
    assert not img.flags.writeable
    with pytest.raises(ValueError):
        img[0, 0, 0] = 1
    with pytest.raises(ValueError):
        img.flags.writeable = True
    mv = memoryview(got)
    assert mv.readonly
    with pytest.raises(TypeError):
        mv[0] = 1
    with pytest.raises(TypeError):
        ctypes.c_char.from_buffer(got)  # asks for a writable buffer: refused
    assert int(img.sum(dtype=np.uint64)) == 7 * img.size


def test_received_message_shares_the_senders_pages(pair, np):
    sent = send_array(pair, np)
    got = pair.rx.recv(timeout=5)
    a = np.frombuffer(got, dtype=np.uint8)
    assert a.ctypes.data == sent.address == got.address
    (frag,) = got.fragments()
    slot, _gen, off = frag.lot_span
    assert frag.address == pair.producer.lot_addr + off
    assert pair.producer.id.startswith(f"{slot}.")


def test_freeze_refused_while_writable_views_exist(pair, np):
    buf = pair.path.alloc(4096)
    mv = memoryview(buf)
    assert not mv.readonly
    arr = np.frombuffer(buf, dtype=np.uint32)
    arr[:] = 5
    assert buf.exports == 2
    with pytest.raises(BufferError):
        buf.freeze()
    mv.release()
    with pytest.raises(BufferError):
        buf.freeze()
    del arr
    gc.collect()
    assert buf.exports == 0
    msg = buf.freeze()
    assert buf.frozen
    # After freezing, no new view of the buffer can be had, writable or not.
    with pytest.raises((BufferError, ValueError)):
        memoryview(buf)
    with pytest.raises(ValueError):
        buf.write(b"x")
    with pytest.raises(ValueError):
        buf.freeze()
    assert np.frombuffer(msg, dtype=np.uint32)[0] == 5


def test_buffer_write_bounds(pair):
    buf = pair.path.alloc(16)
    with pytest.raises(IndexError):
        buf.write(b"x" * 10, offset=10)
    buf.write(b"x" * 6, offset=10)
    assert buf.freeze().to_bytes()[10:] == b"x" * 6


def test_view_keeps_message_alive_until_last_view(pair, np):
    send_array(pair, np, value=9)
    got = pair.rx.recv(timeout=5)
    arr = np.frombuffer(got, dtype=np.uint8)
    view_of_view = memoryview(arr)[100:200]
    sub = arr[10:20]
    with pytest.raises(BufferError):
        got.release()  # views exist
    del got, arr
    gc.collect()
    pair.tx.collect_releases()
    assert pair.path.outstanding > 0  # views still hold the fbuf
    assert bytes(view_of_view) == b"\x09" * 100
    del view_of_view
    gc.collect()
    pair.tx.collect_releases()
    assert pair.path.outstanding > 0
    assert sub.sum() == 90
    del sub
    gc.collect()
    pair.tx.collect_releases()
    assert pair.path.outstanding == 0


def test_release_returns_fbuf_at_once(pair, np):
    send_array(pair, np)
    got = pair.rx.recv(timeout=5)
    got.release()
    pair.tx.collect_releases()
    assert pair.path.outstanding == 0
    with pytest.raises(ValueError):
        memoryview(got)


def test_fragments_and_counted_copies(pair):
    parts = []
    for i in range(3):
        b = pair.path.alloc(10)
        b.write(bytes([65 + i]) * 10)
        parts.append(b.freeze())
    whole = parts[0] + parts[1] + parts[2]
    assert whole.num_fragments == 3
    pair.tx.send(whole)
    got = pair.rx.recv(timeout=5)
    assert got.num_fragments == 3
    with pytest.raises(BufferError):
        memoryview(got)  # several fragments: no single contiguous view
    frags = got.fragments()
    assert [bytes(memoryview(f)) for f in frags] == [b"A" * 10, b"B" * 10, b"C" * 10]
    assert all(memoryview(f).readonly for f in frags)
    before = ferry.copy_stats()
    assert got.to_bytes() == b"A" * 10 + b"B" * 10 + b"C" * 10
    out = bytearray(40)
    assert got.copy_into(out) == 30
    assert bytes(out[:30]) == got.to_bytes()
    after = ferry.copy_stats()
    assert after["copies"] - before["copies"] == 3
    assert after["bytes"] - before["bytes"] == 90
    with pytest.raises(ValueError):
        got.copy_into(bytearray(5))
    with pytest.raises(BufferError):
        got.copy_into(b"read-only target" * 4)


def test_slice_shares_pages(pair):
    pair.tx.send(b"0123456789")
    got = pair.rx.recv(timeout=5)
    s = got.slice(slice(2, 5))
    assert s == b"234"
    assert s.address == got.address + 2


def test_message_from_bytes_is_not_in_a_lot():
    m = ferry.Message(b"abc")
    assert m == b"abc" and not m.in_lot and len(m) == 3
    assert bytes(memoryview(m)) == b"abc"
