"""bench/routing/trace_replay's trace, prompts and client: exact prompts and shares, and a
replay against a real control plane (mocker actors on an in-process Dask cluster, the
OpenAI API under uvicorn) whose engines report the prefix hits the hash ids promise."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.common.load import RequestRecord
from bench.routing.trace import (
    TRACE_BLOCK_TOKENS,
    PromptBuilder,
    TraceRequest,
    block_tokens,
    load_trace,
    parse_slice,
    reusable_block_share,
    reusable_token_share,
    warm_and_slice,
)
from bench.routing.trace_client import (
    ReplayResult,
    arrival_offsets,
    replay,
    reset_prefix_caches,
    summarize,
)
from bench.routing.trace_replay import measured_summary
from tests.control_plane.routing_stack import MODEL, cluster_with_actors, serving_stack


def _request(at_ms: float, length: int, hash_ids: tuple[int, ...], out: int = 2) -> TraceRequest:
    return TraceRequest(at_ms, length, out, hash_ids)


def test_equal_hash_ids_give_equal_tokens_and_the_last_block_is_cut() -> None:
    builder = PromptBuilder()
    first = builder.prompt(_request(0, 1024, (7, 8)))
    second = builder.prompt(_request(0, 1100, (7, 8, 9)))
    other = PromptBuilder().prompt(_request(0, 1024, (7, 8)))  # a fresh builder, same tokens

    assert (len(first), len(second)) == (1024, 1100)
    assert second[:1024] == first == other
    assert second[1024:] == block_tokens(9)[:76]
    assert block_tokens(7) != block_tokens(8)
    assert PromptBuilder(salt=1).prompt(_request(0, 1024, (7, 8))) != first
    assert all(1_000 <= t < 48_000 for t in second)


def test_the_reusable_share_counts_leading_blocks_seen_before() -> None:
    trace = [
        _request(0, 1024, (1, 2)),
        _request(10, 1536, (1, 2, 3)),  # 2 of 3 blocks seen
        _request(20, 1024, (4, 2)),  # 2 seen, but not as a prefix: 0
        _request(30, 600, (1, 5)),  # 1 of 2
    ]

    assert reusable_block_share(trace) == 3 / 9
    # In tokens of 64-token engine blocks: 1024 + 512 cached of 1024+1536+1024+600 tokens.
    assert reusable_token_share(trace, 64) == (1024 + 512) / 4184
    # 300-token blocks: floor(1024/300)*300 = 900, floor(512/300)*300 = 300.
    assert reusable_token_share(trace, 300) == (900 + 300) / 4184
    # A prompt that is all cached still computes its last token.
    assert reusable_token_share([_request(0, 512, (1,)), _request(1, 512, (1,))], 64) == (
        448 / 1024
    )


def test_the_reusable_share_counts_what_the_warm_requests_brought() -> None:
    warm = [_request(0, 1024, (1, 2))]
    measured = [_request(10, 1536, (1, 2, 3)), _request(20, 1024, (4, 5))]

    assert reusable_block_share(measured) == 0
    assert reusable_block_share(measured, warm) == 2 / 5
    assert reusable_token_share(measured, 64, warm) == 1024 / 2560


def test_only_the_slice_after_the_warm_requests_is_measured() -> None:
    def result(due: float, ttft: float, prompt: int, cached: int) -> ReplayResult:
        record = RequestRecord(ttft_s=ttft, completion_tokens=2, prompt_tokens=prompt)
        record.cached_tokens, record.done, record.done_s = cached, True, ttft + 0.1
        request = _request(int(due * 1000), prompt, (1, 2), out=2)
        return ReplayResult(request, due, 0.0, record)

    results = [result(0.0, 9.0, 1000, 0), result(2.0, 0.5, 1000, 500), result(4.0, 1.5, 500, 0)]

    row = measured_summary(10.0, results, warm=1)

    assert row["requests"] == 2 and row["wall_s"] == 8.0 and row["req_per_s"] == 2 / 8.0
    assert row["ttft_ms"]["mean"] == 1000.0  # (500 + 1500) / 2: the warm 9 s is not in it
    assert row["kv_hit_rate"] == 500 / 1500
    assert row["warm"] == {"requests": 1, "requests_ok": 1, "kv_hit_rate": 0.0}
    assert "warm" not in measured_summary(10.0, results, warm=0)


def test_arrivals_are_the_trace_times_over_the_speedup(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 1000, "input_length": 10, "output_length": 3, "hash_ids": [0]},
        {"timestamp": 1500, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 4000, "input_length": 5, "output_length": 2, "hash_ids": [2]},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")

    trace = load_trace(path)

    assert trace[1] == TraceRequest(1500.0, 600, 1, (0, 1))
    assert arrival_offsets(trace, 2.0) == [0.0, 0.25, 1.5]
    assert trace[parse_slice("1:")] == trace[1:] and trace[parse_slice(":1")] == trace[:1]
    with pytest.raises(ValueError, match="expected START:STOP"):
        parse_slice("3")
    with pytest.raises(ValueError, match="expected a number > 0"):
        arrival_offsets(trace, 0)
    with pytest.raises(ValueError, match=r"input_length has value 1025; expected 1..1024"):
        TraceRequest(0, 1025, 1, (1, 2))


def test_lines_without_enough_hash_ids_get_blocks_of_their_own(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 20, "input_length": 1100, "output_length": 3, "hash_ids": [5]},
        {"timestamp": 10, "input_length": 600, "output_length": 1, "session_id": "s"},
        {"timestamp": 20, "input_length": 512, "output_length": 2, "hash_ids": []},
        {"timestamp": 30, "input_length": 700, "output_length": 2, "hash_ids": [5, 6, 7]},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    trace = load_trace(path)

    # Arrival order, file order among equal times; fresh ids counted down in file order.
    assert trace == [
        TraceRequest(10.0, 600, 1, (-3, -4)),
        TraceRequest(20.0, 1100, 3, (5, -1, -2)),
        TraceRequest(20.0, 512, 2, (-5,)),
        TraceRequest(30.0, 700, 2, (5, 6, 7)),
    ]
    builder = PromptBuilder()
    assert builder.prompt(trace[1])[:512] == builder.prompt(trace[3])[:512]
    assert builder.prompt(trace[1])[512:1024] != builder.prompt(trace[3])[512:1024]
    assert reusable_block_share(trace) == 1 / 9  # only block 5, in the last request


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 0, "output_length": 2, "hash_ids": [1]}', "line 2: .*'input_length'"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 2}', "line 2: .*expected >= 1"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        ('{"timestamp": 0, "input_length": 9, "output_length": 2', "line 2: Expecting"),
        ('{"timestamp": 0, "input_length": "x", "output_length": 2}', "line 2: invalid literal"),
    ],
)
def test_a_line_that_cannot_be_read_is_refused_with_its_number(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "trace.jsonl"
    good = '{"timestamp": 0, "input_length": 9, "output_length": 2, "hash_ids": [1]}'
    path.write_text(good + "\n" + line + "\n")

    with pytest.raises(ValueError, match=message):
        load_trace(path)


@pytest.mark.slow
def test_a_replay_hits_the_prefixes_its_hash_ids_share(smollm2_folder: Path) -> None:
    trace = [
        _request(0, 1024, (1, 2), out=3),
        # Seconds apart, so each request has ended before the next one is due (a loaded
        # machine must not turn a prefix hit into a miss of a still-running prefill).
        _request(3000, 1500, (1, 2, 3), out=2),  # its first 2 blocks: 1024 cached tokens
        _request(6000, 700, (4, 5), out=4),  # nothing shared
        _request(9000, 1500, (1, 2, 3), out=2),  # all of it but the last partial block
    ]

    async def main() -> None:
        async with (
            cluster_with_actors(smollm2_folder, 2) as proxies,
            serving_stack(proxies) as stack,
        ):
            base_url = str(stack.http.base_url).rstrip("/")
            replayed = await replay(base_url, MODEL, trace, speedup=2.0, builder=PromptBuilder())
            # A phase after this one starts cold: the engines' caches emptied.
            await asyncio.to_thread(reset_prefix_caches, base_url)
            _, again = await replay(
                base_url, MODEL, trace[3:], speedup=2.0, builder=PromptBuilder()
            )
            return replayed, again

    (wall, results), again = asyncio.run(main())

    assert [r.ok for r in results] == [True] * 4
    assert [r.scheduled_s for r in results] == [0.0, 1.5, 3.0, 4.5]
    assert all(0 <= r.send_lag_s < 1.0 for r in results)  # a bound, not a benchmark
    assert [r.record.completion_tokens for r in results] == [3, 2, 4, 2]
    assert [r.record.prompt_tokens for r in results] == [1024, 1500, 700, 1500]
    # mocker blocks of 16 tokens: a full cached trace block is 32 of them; the prompt's
    # last token is always computed (1488 = 93 blocks of the 1500-token prompt).
    assert [r.record.cached_tokens for r in results] == [0, 1024, 0, 1488]
    assert [r.record.cached_tokens for r in again] == [0]
    summary = summarize(wall, results)
    assert summary["kv_hit_rate"] == (1024 + 1488) / (1024 + 1500 + 700 + 1500)
    assert summary["requests_ok"] == 4 and summary["failures"] == {}
    assert [row[:2] for row in summary["per_request"]] == [
        [1024, 0],
        [1500, 1024],
        [700, 0],
        [1500, 1488],
    ]
    assert TRACE_BLOCK_TOKENS == 512


def test_the_warm_requests_are_the_ones_before_the_slices_resolved_start() -> None:
    trace = [_request(i, 512, (i,)) for i in range(6)]

    assert warm_and_slice(trace, parse_slice("3:5"), 2) == (trace[1:3], trace[3:5])
    assert warm_and_slice(trace, parse_slice("-2:"), 3) == (trace[1:4], trace[4:])
    assert warm_and_slice(trace, parse_slice("1:3"), 5) == (trace[:1], trace[1:3])
