import json
import threading

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


def stored() -> BlockStored:
    return BlockStored((H1, H2), parent_hash=SequenceHash(7), token_ids=(1, 2, 3, 4), block_size=2)


def test_event_dicts_have_type_key():
    assert stored().to_dict() == {
        "type": "stored",
        "block_hashes": [101, 202],
        "parent_hash": 7,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
    }
    assert BlockRemoved((H1,)).to_dict() == {"type": "removed", "block_hashes": [101]}
    assert AllBlocksCleared().to_dict() == {"type": "cleared"}


@pytest.mark.parametrize(
    "event",
    [
        stored(),
        BlockStored((H1,), parent_hash=None, token_ids=(5, 6), block_size=2),
        BlockRemoved((H1, H2)),
        AllBlocksCleared(),
    ],
)
def test_event_round_trips_through_json(event):
    assert event_from_dict(json.loads(json.dumps(event.to_dict()))) == event


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
    with pytest.raises(ValueError, match="token_ids has 3 tokens; expected 4"):
        BlockStored((H1, H2), parent_hash=None, token_ids=(1, 2, 3), block_size=2)


def test_block_stored_validates_block_size():
    with pytest.raises(ValueError, match="block_size must be positive, got 0"):
        BlockStored((H1,), parent_hash=None, token_ids=(), block_size=0)


def test_events_reject_empty_hashes():
    with pytest.raises(ValueError, match=r"BlockRemoved\.block_hashes must not be empty"):
        BlockRemoved(())
    with pytest.raises(ValueError, match=r"BlockStored\.block_hashes must not be empty"):
        BlockStored((), parent_hash=None, token_ids=(), block_size=2)


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

    assert event == BlockStored(
        block_hashes=(7,), parent_hash=None, token_ids=(3, 0, 5), block_size=3
    )
