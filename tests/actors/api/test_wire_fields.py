"""Decoding actor info and stats that crossed the wire: a missing field is an error that
names it, an unknown one (a newer actor's, in a rolling upgrade) is ignored and logged
once per set of fields."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.api.stats import EngineStats
from dynask.actors.api.wire_fields import WireDecoder

WIRE_LOG = "dynask.actors.api.wire_fields"


def _info(**extra: Any) -> dict[str, Any]:
    return {
        "name": "mock-0",
        "stream_address": "127.0.0.1:4000",
        "max_model_len": 2048,
        "engine": "mocker",
        "model": None,
        "worker": "local",
        **extra,
    }


def _stats(**extra: Any) -> dict[str, Any]:
    stats = EngineStats.load_only(num_running=2, steps=7, prompt_tokens=30, generated_tokens=11)
    return {**stats.to_dict(), **extra}


def test_an_unknown_info_field_is_ignored_and_named_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=WIRE_LOG):
        info = ActorInfo.from_dict(_info(kv_future_hint=3, kv_block_size=16))

    assert info == ActorInfo(
        name="mock-0",
        stream_address="127.0.0.1:4000",
        max_model_len=2048,
        engine="mocker",
        model=None,
        worker="local",
        kv_block_size=16,
    )
    assert [r.getMessage() for r in caplog.records] == [
        "unknown fields in engine actor info, ignored (sent by a newer engine actor?): "
        "kv_future_hint"
    ]


def test_a_missing_info_field_is_an_error_that_names_it() -> None:
    data = _info()
    del data["worker"]
    with pytest.raises(ValueError, match=r"incomplete engine actor info: .*'worker'"):
        ActorInfo.from_dict(data)


def test_info_that_is_not_a_dict_is_refused() -> None:
    with pytest.raises(ValueError, match=r"engine actor info must be a dict, got \[1\]"):
        ActorInfo.from_dict([1])  # type: ignore[arg-type]


def test_info_still_validates_its_values() -> None:
    with pytest.raises(ValueError, match="ActorInfo 'max_model_len' has value 0"):
        ActorInfo.from_dict(_info(max_model_len=0))


def test_stats_round_trip_and_recompute_the_derived_rates() -> None:
    data = _stats(prefix_queried_tokens=40, prefix_hit_tokens=10, prefix_hit_rate=0.99)
    stats = EngineStats.from_dict(data)
    assert stats.prefix_hit_rate == 0.25  # recomputed, not the 0.99 sent
    assert EngineStats.from_dict(stats.to_dict()) == stats


def test_unknown_stats_counters_are_logged_once_per_set_of_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    derived = ("prefix_hit_rate", "device_hit_rate", "host_hit_rate", "disk_hit_rate")
    decoder = WireDecoder(EngineStats, "engine stats", derived=derived)
    with caplog.at_level(logging.WARNING, logger=WIRE_LOG):
        for _ in range(3):  # three heartbeats from the same newer actor
            stats = decoder.decode(_stats(gpu_watts=512.0, num_swaps=4))
        decoder.decode(_stats(num_swaps=4))  # another set: reported too

    assert (stats.num_running, stats.num_steps, stats.generated_tokens) == (2, 7, 11)
    assert [r.getMessage().rsplit(": ", 1)[1] for r in caplog.records] == [
        "gpu_watts, num_swaps",
        "num_swaps",
    ]
    assert decoder.unknown_fields(_stats(zz=1, aa=2)) == ["aa", "zz"]


def test_a_missing_stats_counter_is_an_error_that_names_it() -> None:
    data = _stats()
    del data["num_steps"]
    with pytest.raises(ValueError, match=r"incomplete engine stats: .*'num_steps'"):
        EngineStats.from_dict(data)
