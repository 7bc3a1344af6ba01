"""The deployment and worker forms: validated field by field, then stored and applied."""

from __future__ import annotations

import html
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from dynask.actors.runtime.gpu_discovery import GPUInfo
from dynask.control_plane.cluster.gpu_placement import place_workers
from tests.web.admin_stack import AdminStack

VALID = {
    "name": "mock",
    "model": "",
    "served_model_name": "",
    "engine": "mocker",
    "role": "aggregated",
    "replicas": "2",
    "engine_args": '{"speedup_ratio": 0}',
}


def _errors(page: str) -> dict[str, str]:
    found = re.findall(r'<div class="field-error" id="error-(\w+)">([^<]*)</div>', page)
    return {name: html.unescape(message) for name, message in found}


def _flashes(page: str) -> list[str]:
    return [
        html.unescape(m) for m in re.findall(r'<div class="flash \w+" role="status">([^<]*)<', page)
    ]


def _create(stack: AdminStack, csrf: str, **changes: str) -> tuple[int, str]:
    response = stack.client.post(
        "/admin/deployments", data={**VALID, **changes, "csrf_token": csrf}
    )
    return response.status_code, response.text


@pytest.mark.parametrize(
    ("changes", "errors"),
    [
        (
            {"name": "Bad Name"},
            {
                "name": "'Bad Name' is not a valid name; use 1-63 lowercase letters, digits or "
                "dashes, starting and ending with a letter or digit (e.g. smollm2-chat)"
            },
        ),
        ({"name": ""}, {"name": "a name is required, e.g. smollm2-chat"}),
        ({"replicas": "two"}, {"replicas": "'two' is not a whole number; enter 0 to 64"}),
        ({"replicas": "65"}, {"replicas": "65 is out of range; enter 0 to 64"}),
        (
            {"engine_args": "{speed: 1}"},
            {
                "engine_args": "not valid JSON (Expecting property name enclosed in double "
                'quotes at line 1, column 2); write an object such as {"max_num_seqs": 8}'
            },
        ),
        (
            {"engine_args": "[1]"},
            {"engine_args": 'expected a JSON object such as {"max_num_seqs": 8}, got list'},
        ),
        (
            {"engine_args": '{"speedup": 0}'},
            {
                "engine_args": "engine argument 'speedup' is not known to out=mocker; known: "
                "block_size, decode_ms_base, decode_ms_per_active_block, decode_ms_per_kv_usage, "
                "decode_ms_per_kv_usage_squared, enable_prefix_caching, "
                "eos_probability, kv_transfer_ms_per_block, max_model_len, "
                "max_num_batched_tokens, max_num_seqs, "
                "num_kv_blocks, prefill_ms_base, prefill_ms_per_token, prefill_quadratic_ms, "
                "prefix_cache_protected_share, seed, speedup_ratio, vocab_size"
            },
        ),
        (
            {"engine_args": '{"speedup_ratio": -1}'},
            {"engine_args": "MockerConfig 'speedup_ratio' has value -1; expected a number >= 0"},
        ),
        (
            {"engine_args": '{"speedup_ratio": "fast"}'},
            {
                "engine_args": "engine argument 'speedup_ratio' of out=mocker has value 'fast' "
                "of type str; expected float"
            },
        ),
        (
            {"model": "/no/such/folder"},
            {
                "model": "'/no/such/folder' is neither an existing folder or .gguf file nor a "
                "hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'"
            },
        ),
        (
            {"engine": "sglang"},
            {
                "engine": "'sglang' is not valid; expected one of torch, vllm, mocker, echo, "
                "python, openai"
            },
        ),
        (
            {"engine": "vllm", "engine_args": '{"tensor_parallel_size": 0}'},
            {"engine_args": "VLLMArgs 'tensor_parallel_size' has value 0; expected an int >= 1"},
        ),
        (
            {"role": "router"},
            {"role": "'router' is not valid; expected one of aggregated, prefill, decode"},
        ),
    ],
)
def test_a_wrong_field_is_named_with_its_message(
    stack: AdminStack, csrf: str, changes: dict[str, str], errors: dict[str, str]
) -> None:
    status, page = _create(stack, csrf, **changes)
    assert (status, _errors(page)) == (400, errors)
    assert "The deployment was not created" in page
    assert stack.runtime.deployments == []
    assert stack.deps.repo.list_deployments() == []


def test_the_form_keeps_what_was_typed(stack: AdminStack, csrf: str) -> None:
    _, page = _create(stack, csrf, replicas="x", engine_args='{"seed": 3}')
    assert 'name="name" value="mock"' in page
    assert html.unescape(page).count('{"seed": 3}') == 1
    assert '<option value="mocker" selected>' in page


def test_a_folder_without_config_is_not_a_model(
    stack: AdminStack, csrf: str, tmp_path: Path
) -> None:
    _, page = _create(stack, csrf, model=str(tmp_path))
    assert _errors(page) == {
        "model": f"the folder '{tmp_path}' has no config.json; it is not an HF model folder"
    }


def test_a_deployment_is_stored_applied_and_logged(stack: AdminStack, csrf: str) -> None:
    status, _ = _create(stack, csrf)
    assert status == 303
    [plan] = stack.runtime.deployments
    assert (plan.name, plan.served_model_name, plan.replicas) == ("mock", "mock", 2)
    assert (plan.engine, plan.model_path, plan.engine_args) == (
        "mocker",
        None,
        {"speedup_ratio": 0},
    )
    [event] = stack.deps.repo.recent_events()
    assert (event.who, event.kind, event.subject) == ("admin", "deployment.created", "mock")
    page = stack.client.get("/admin/deployments").text
    assert _flashes(page) == ["Deployment 'mock' created; its actors are starting."]
    assert '<span class="badge waiting">waiting</span>' in page
    assert "0/2 ready; waiting for a free worker" in page


def test_a_taken_name_is_refused(stack: AdminStack, csrf: str) -> None:
    _create(stack, csrf)
    status, page = _create(stack, csrf)
    assert (status, _errors(page)) == (
        400,
        {"name": "Deployment 'mock' already exists; pick another name or scale it"},
    )


def test_scale_and_delete(stack: AdminStack, csrf: str) -> None:
    _create(stack, csrf)
    stack.client.get("/admin/deployments")  # shows (and so clears) the flash of the create
    client = stack.client
    response = client.post(
        "/admin/deployments/mock/scale", data={"replicas": "0", "csrf_token": csrf}
    )
    assert response.status_code == 303
    assert stack.runtime.deployments[0].replicas == 0
    page = client.get("/admin/deployments").text
    assert _flashes(page) == ["Deployment 'mock' scaled to 0 replicas."]
    assert '<span class="badge stopped">stopped</span>' in page
    client.post("/admin/deployments/mock/delete", data={"csrf_token": csrf})
    assert stack.runtime.deployments == []
    kinds = [(e.who, e.kind) for e in stack.deps.repo.recent_events()]
    assert kinds == [
        ("admin", "deployment.deleted"),
        ("admin", "deployment.scaled"),
        ("admin", "deployment.created"),
    ]


def test_scaling_to_a_wrong_number_says_why(stack: AdminStack, csrf: str) -> None:
    _create(stack, csrf)
    stack.client.get("/admin/deployments")
    stack.client.post("/admin/deployments/mock/scale", data={"replicas": "-1", "csrf_token": csrf})
    assert _flashes(stack.client.get("/admin/deployments").text) == [
        "Cannot scale 'mock': -1 is out of range; enter 0 to 64."
    ]
    assert stack.runtime.deployments[0].replicas == 2


def test_an_unknown_deployment_cannot_be_scaled(stack: AdminStack, csrf: str) -> None:
    stack.client.post("/admin/deployments/nope/scale", data={"replicas": "1", "csrf_token": csrf})
    assert _flashes(stack.client.get("/admin/deployments").text) == [
        "Deployment 'nope' does not exist"
    ]


def test_workers_cannot_be_added_before_the_cluster_runs(stack: AdminStack, csrf: str) -> None:
    stack.client.post("/admin/workers/add", data={"csrf_token": csrf})
    assert _flashes(stack.client.get("/admin/workers").text) == [
        "the cluster is still starting; try again in a moment"
    ]


class PinnedClusterStandIn:
    """The embedded cluster's surface that "Start a local worker" uses: its workers by
    name, the name the next one gets, and ``scale`` (recorded, nothing starts)."""

    scheduler_address = "tcp://127.0.0.1:8786"

    def __init__(self, workers: int) -> None:
        self.worker_spec: dict[int, dict[str, object]] = {i: {} for i in range(workers)}
        self.scaled_to: list[int] = []

    def new_worker_spec(self) -> dict[int, dict[str, object]]:
        return {len(self.worker_spec): {}}

    def scale(self, n: int) -> None:
        self.scaled_to.append(n)


def test_a_worker_that_would_overcommit_its_gpu_is_refused_as_dynask_run_refuses(
    stack: AdminStack, csrf: str
) -> None:
    # dynask run --workers 2 --gpu-memory-utilization 0.42 on one GPU: a third engine
    # would take GPU 0 to 1.26 of its memory.
    one_gpu = [GPUInfo(0, "FAKE GPU", 80 * 2**30, 0, 0, "GPU-fake-0000")]
    stack.runtime.gpu_placements = place_workers(2, one_gpu, fraction=0.42)
    cluster = PinnedClusterStandIn(workers=2)
    stack.runtime.cluster = cluster  # type: ignore[assignment]
    stack.runtime.client = SimpleNamespace(status="connecting")  # type: ignore[assignment]
    stack.client.post("/admin/workers/add", data={"csrf_token": csrf})
    assert _flashes(stack.client.get("/admin/workers").text) == [
        "No worker started: GPU 0 would hold 3 engines at gpu_memory_utilization "
        "0.42 + 0.42 + 0.42 = 1.26 of its memory; the engines of one GPU must add up to at "
        "most 1 (e.g. --gpu-memory-utilization 0.33)"
    ]
    assert cluster.scaled_to == []  # nothing started
    stack.runtime.cluster = None  # the idle runtime's teardown closes no cluster
    stack.runtime.client = None


def test_the_workers_page_shows_the_commands(stack: AdminStack, csrf: str) -> None:
    page = stack.client.get("/admin/workers").text
    assert (
        "CUDA_VISIBLE_DEVICES=0 dask worker tcp://SCHEDULER:8786 --nthreads 1 --resources GPU=1"
        in page
    )
    assert "dask cuda worker tcp://SCHEDULER:8786 --resources GPU=1" in page
    assert "Start a local worker" in page
