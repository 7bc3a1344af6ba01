"""``dynask run --prefill-workers P --decode-workers D``, roles in ``deploy.yaml``, and the
disaggregation flags' mistakes; one end-to-end run with real worker processes."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from dynask.control_plane.cli.disagg_flags import embedded_deployments
from dynask.control_plane.cli.main import _parser, main
from dynask.control_plane.cluster.deploy_file import read_deploy_file
from dynask.control_plane.state.deployment import DeploymentSpec, Role
from tests.control_plane import server_process as sp
from tests.system_tools import require_module

AGGREGATED = DeploymentSpec("default", engine="mocker", served_model_name="m")


def test_prefill_and_decode_workers_make_two_deployments() -> None:
    args = _parser().parse_args(["run", "--prefill-workers", "1", "--decode-workers", "3"])
    plans, workers = embedded_deployments(args, AGGREGATED)
    assert [(p.name, p.served_model_name, p.replicas, p.role) for p in plans] == [
        ("default-prefill", "m", 1, Role.PREFILL),
        ("default-decode", "m", 3, Role.DECODE),
    ]
    assert workers == 4
    plain = _parser().parse_args(["run", "--workers", "2"])
    assert embedded_deployments(plain, AGGREGATED) == ([AGGREGATED], 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prefill-workers", "2"], "--prefill-workers is 2 and --decode-workers is 0"),
        (
            ["--prefill-workers", "1", "--decode-workers", "1", "--workers", "3"],
            "--workers 3 contradicts --prefill-workers 1 + --decode-workers 1",
        ),
    ],
)
def test_inconsistent_worker_counts_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        embedded_deployments(_parser().parse_args(["run", *argv]), AGGREGATED)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv-transport", "nccl"], "argument --kv-transport: invalid choice: 'nccl'"),
        (
            ["--remote-prefill-min-tokens", "-1"],
            "argument --remote-prefill-min-tokens: has value '-1'; expected an integer >= 0",
        ),
        (["--kv-transfer-timeout", "0"], "'transfer_timeout_s' has value 0.0; expected a number"),
    ],
)
def test_bad_disaggregation_flags_name_the_flag(flags: list[str], message: str, capsys) -> None:
    try:
        code = main(["serve", "--scheduler", "tcp://127.0.0.1:1", *flags])
    except SystemExit as exit:
        code = int(exit.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_roles_in_the_deploy_file(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "deployments:\n"
        "  - {name: p, model_name: m, engine: mocker, role: prefill}\n"
        "  - {name: d, model_name: m, engine: mocker, role: decode, replicas: 2}\n"
        "  - {name: a, engine: mocker}\n"
    )
    assert [(p.name, p.role) for p in read_deploy_file(str(path))] == [
        ("p", "prefill"),
        ("d", "decode"),
        ("a", "aggregated"),
    ]
    path.write_text("deployments:\n  - {name: x, role: encode}\n")
    with pytest.raises(ValueError, match="'role' has value 'encode'; expected one of aggregated"):
        read_deploy_file(str(path))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["tcp", "ucxx"])
def test_dynask_run_with_prefill_and_decode_workers(
    tokenizer_folder: Path, tmp_path: Path, transport: str
) -> None:
    if transport == "ucxx":
        require_module("ucxx", "ucxx-cu12")
    args = ["--out", "mocker", str(tokenizer_folder), "--model-name", "m"]
    args += ["--prefill-workers", "1", "--decode-workers", "1", "--remote-prefill-min-tokens", "1"]
    args += ["--kv-transport", transport]
    with sp.dynask_run(tmp_path, args) as (base, _):
        sp.wait_for_engines(base, 2)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        prompt = list(range(1000, 1100))
        reply = client.completions.create(
            model="m", prompt=prompt, max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert reply.usage.completion_tokens == 4
        decisions = httpx.get(f"{base}/v1/routing/decisions", params={"limit": 5}).json()["data"]
        winners = {d["request_id"].endswith("/prefill"): d["winner"] for d in decisions}
        assert winners == {True: "default-prefill-0", False: "default-decode-0"}
