import json
import threading

import msgpack
import pytest

from dynask.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventLog,
    KVEventRecord,
    event_from_dict,
)
from dynask.kv.hashing import SequenceHash

H1, H2 = SequenceHash(101), SequenceHash(202)
# 1, 2, 3, 4 as little-endian u32: the bytes a stored event carries (and hashes)
PACKED_1234 = b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00"


def stored() -> BlockStored:
    return BlockStored.from_token_ids(
        (H1, H2), parent_hash=SequenceHash(7), token_ids=(1, 2, 3, 4), block_size=2
    )


def test_event_dicts_have_type_key():
    assert stored().to_dict() == {
        "type": "stored",
        "block_hashes": [101, 202],
        "parent_hash": 7,
        "packed_token_ids": PACKED_1234,
        "block_size": 2,
    }
    assert stored().to_dict(packed=False) == {
        "type": "stored",
        "block_hashes": [101, 202],
        "parent_hash": 7,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
    }
    assert BlockRemoved((H1,)).to_dict() == {"type": "removed", "block_hashes": [101]}
    assert AllBlocksCleared().to_dict() == {"type": "cleared"}


EVENTS = [
    stored(),
    BlockStored.from_token_ids((H1,), parent_hash=None, token_ids=(5, 6), block_size=2),
    BlockRemoved((H1, H2)),
    AllBlocksCleared(),
]


@pytest.mark.parametrize("event", EVENTS)
def test_event_round_trips_through_json(event):
    assert event_from_dict(json.loads(json.dumps(event.to_dict(packed=False)))) == event


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("packed", [True, False])
def test_event_round_trips_through_msgpack(event, packed):
    wire = msgpack.unpackb(msgpack.packb(event.to_dict(packed=packed), use_bin_type=True))
    assert event_from_dict(wire) == event


def test_record_round_trips_through_json():
    record = KVEventRecord(3, BlockRemoved((H1,)))
    wire = json.loads(json.dumps(record.to_dict()))
    assert wire == {"event_id": 3, "event": {"type": "removed", "block_hashes": [101]}}
    assert KVEventRecord.from_dict(wire) == record


def test_u64_hash_survives_json():
    big = SequenceHash(2**64 - 1)
    event = BlockRemoved((big,))
    assert event_from_dict(json.loads(json.dumps(event.to_dict()))) == event


def test_record_from_dict_rejects_missing_event():
    with pytest.raises(ValueError, match="field 'event' has value None"):
        KVEventRecord.from_dict({"event_id": 1})


def test_event_from_dict_rejects_unknown_type():
    with pytest.raises(ValueError, match="field 'type' has value 'bogus'"):
        event_from_dict({"type": "bogus"})


def test_event_from_dict_rejects_non_int_hash():
    with pytest.raises(ValueError, match="field 'block_hashes' has value '1'"):
        event_from_dict({"type": "removed", "block_hashes": ["1"]})


def test_event_from_dict_rejects_missing_field():
    with pytest.raises(ValueError, match="field 'block_size' has value None"):
        event_from_dict({"type": "stored", "block_hashes": [1], "token_ids": [1, 2]})


def test_block_stored_validates_token_count():
    with pytest.raises(ValueError, match=r"packed_token_ids has 12 bytes; expected 16 \(2 blocks"):
        BlockStored.from_token_ids((H1, H2), parent_hash=None, token_ids=(1, 2, 3), block_size=2)


def test_block_stored_validates_block_size():
    with pytest.raises(ValueError, match="block_size must be positive, got 0"):
        BlockStored.from_token_ids((H1,), parent_hash=None, token_ids=(), block_size=0)


def test_events_reject_empty_hashes():
    with pytest.raises(ValueError, match=r"BlockRemoved\.block_hashes must not be empty"):
        BlockRemoved(())
    with pytest.raises(ValueError, match=r"BlockStored\.block_hashes must not be empty"):
        BlockStored.from_token_ids((), parent_hash=None, token_ids=(), block_size=2)


def test_record_rejects_non_positive_id():
    with pytest.raises(ValueError, match="event_id must be >= 1, got 0"):
        KVEventRecord(0, AllBlocksCleared())


def test_log_ids_start_at_one_and_drain_clears():
    log = KVEventLog()
    assert log.last_event_id == 0
    assert log.record(BlockRemoved((H1,))) == 1
    assert log.record(AllBlocksCleared()) == 2
    assert log.drain() == [
        KVEventRecord(1, BlockRemoved((H1,))),
        KVEventRecord(2, AllBlocksCleared()),
    ]
    assert log.drain() == []
    assert log.last_event_id == 2
    assert log.record(AllBlocksCleared()) == 3
    assert log.drain() == [KVEventRecord(3, AllBlocksCleared())]


def test_log_ids_are_unique_and_gapless_across_threads():
    log = KVEventLog()
    drained: list[KVEventRecord] = []

    def record_many():
        for _ in range(1000):
            log.record(AllBlocksCleared())

    writers = [threading.Thread(target=record_many) for _ in range(4)]
    for thread in writers:
        thread.start()
    while any(thread.is_alive() for thread in writers):
        drained.extend(log.drain())
    for thread in writers:
        thread.join()
    drained.extend(log.drain())
    assert [record.event_id for record in drained] == list(range(1, 4001))


def test_the_listener_wakes_once_per_batch_that_reaches_an_empty_log():
    log = KVEventLog()
    wakes: list[int] = []
    log.set_listener(lambda: wakes.append(log.last_event_id))
    log.record(AllBlocksCleared())
    log.record(AllBlocksCleared())  # the log still holds event 1: no new wake-up
    assert wakes == [1]
    assert [r.event_id for r in log.drain()] == [1, 2]
    log.record(AllBlocksCleared())
    assert wakes == [1, 3]
    log.set_listener(None)
    log.drain()
    log.record(AllBlocksCleared())
    assert wakes == [1, 3]


def test_event_from_dict_rejects_a_bool_among_the_tokens():
    wire = {"type": "stored", "block_hashes": [1], "token_ids": [1, True], "block_size": 2}

    with pytest.raises(ValueError, match="field 'token_ids' has value True; expected an int"):
        event_from_dict(wire)


def test_event_from_dict_reads_tokens_as_a_tuple_of_the_same_ints():
    wire = {"type": "stored", "block_hashes": [7], "token_ids": [3, 0, 5], "block_size": 3}

    event = event_from_dict(wire)

    assert event == BlockStored.from_token_ids(
        block_hashes=(7,), parent_hash=None, token_ids=(3, 0, 5), block_size=3
    )


def test_a_stored_event_packs_its_tokens_as_little_endian_u32():
    event = BlockStored.from_token_ids((H1,), None, (1, 2**32 - 1), block_size=2)

    assert event.packed_token_ids == b"\x01\x00\x00\x00\xff\xff\xff\xff"
    assert event.token_ids == (1, 2**32 - 1)
    assert event == BlockStored((H1,), None, b"\x01\x00\x00\x00\xff\xff\xff\xff", 2)


def test_the_packed_and_the_list_form_read_back_as_one_event():
    packed = {"type": "stored", "block_hashes": [101, 202], "parent_hash": 7, "block_size": 2}
    listed = dict(packed, token_ids=[1, 2, 3, 4])
    packed["packed_token_ids"] = PACKED_1234

    assert event_from_dict(packed) == event_from_dict(listed) == stored()
    assert event_from_dict(packed).packed_token_ids is PACKED_1234  # taken as is, not copied


def test_a_record_of_packed_tokens_round_trips_through_msgpack():
    record = KVEventRecord(9, stored())
    wire = msgpack.unpackb(msgpack.packb(record.to_dict(), use_bin_type=True), raw=False)

    assert wire == {
        "event_id": 9,
        "event": {
            "type": "stored",
            "block_hashes": [101, 202],
            "parent_hash": 7,
            "packed_token_ids": PACKED_1234,
            "block_size": 2,
        },
    }
    assert KVEventRecord.from_dict(wire) == record


def test_packed_tokens_not_a_multiple_of_four_bytes_are_refused():
    wire = {"type": "stored", "block_hashes": [1], "packed_token_ids": b"\x01\x00\x00\x00\x02"}

    with pytest.raises(
        ValueError, match=r"field 'packed_token_ids' has 5 bytes; expected a multiple of 4"
    ):
        event_from_dict({**wire, "block_size": 2})


def test_packed_tokens_of_the_wrong_count_for_the_blocks_are_refused():
    wire = {"type": "stored", "block_hashes": [1, 2], "packed_token_ids": PACKED_1234[:12]}

    with pytest.raises(
        ValueError,
        match=r"BlockStored\.packed_token_ids has 12 bytes; expected 16 \(2 blocks of 2 u32",
    ):
        event_from_dict({**wire, "block_size": 2})


def test_packed_tokens_that_are_not_bytes_are_refused():
    wire = {"type": "stored", "block_hashes": [1], "packed_token_ids": "\x01\x00\x00\x00"}

    with pytest.raises(ValueError, match="field 'packed_token_ids' has type str; expected bytes"):
        event_from_dict({**wire, "block_size": 1})
    with pytest.raises(ValueError, match="packed_token_ids has type tuple; expected bytes"):
        BlockStored((H1,), None, (1, 2), 2)  # type: ignore[arg-type]


def test_listed_tokens_past_u32_are_refused_naming_the_token():
    wire = {"type": "stored", "block_hashes": [1], "token_ids": [1, 2**32], "block_size": 2}

    with pytest.raises(ValueError, match=r"field 'token_ids': token_ids\[1\] has value 4294967296"):
        event_from_dict(wire)
