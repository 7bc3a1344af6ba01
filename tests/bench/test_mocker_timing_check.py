"""bench.routing.mocker_timing_check: its small traces, exactly (the replays themselves need
the Dynamo peer and are run by hand; see the module)."""

from __future__ import annotations

from bench.routing.mocker_timing_check import CASES, case_lines, format_table, ratio_rows


def test_mixed_case_is_four_decodes_then_twenty_spaced_prompts() -> None:
    lines = case_lines(CASES["mixed"])
    assert len(lines) == 24
    arrivals = [200 + 150 * i for i in range(20)]
    assert [line["timestamp"] for line in lines] == [0, 0, 0, 0, *arrivals]
    assert [line["output_length"] for line in lines[:5]] == [300, 300, 300, 300, 2]
    assert lines[0]["hash_ids"] == [1] and lines[4]["hash_ids"] == list(range(5, 13))
    assert all(line["input_length"] == 512 * len(line["hash_ids"]) for line in lines)
    ids = [i for line in lines for i in line["hash_ids"]]
    assert len(ids) == len(set(ids)) == 4 + 20 * 8  # no prompt shares a block


def test_table_gives_ours_over_dynamo() -> None:
    sides = {"dynask": {"ttft_mean_ms": 110.0, "itl_mean_ms": 5.0, "e2e_p50_ms": 200.0},
             "dynamo": {"ttft_mean_ms": 100.0, "itl_mean_ms": 4.0, "e2e_p50_ms": None}}  # fmt: skip
    table = format_table({"lone4k": sides}).splitlines()
    assert table[1].split() == ["lone4k", "ttft_mean_ms", "110.0", "100.0", "1.100"]
    assert table[2].split()[-1] == "1.250"
    assert table[3].split() == ["lone4k", "e2e_p50_ms", "200.0", "-", "-"]


def test_ratio_rows_are_ours_over_dynamo_per_case() -> None:
    sides = {"dynask": {"ttft_mean_ms": 110.0, "itl_mean_ms": 5.0, "e2e_p50_ms": 200.0},
             "dynamo": {"ttft_mean_ms": 100.0, "itl_mean_ms": 4.0, "e2e_p50_ms": None}}  # fmt: skip
    assert ratio_rows({"lone4k": sides}) == [
        {"case": "lone4k", "ttft_mean_ratio": 1.1, "itl_mean_ratio": 1.25, "e2e_p50_ratio": None}
    ]
