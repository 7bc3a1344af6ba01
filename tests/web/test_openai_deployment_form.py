"""The deployment form's ``openai`` engine (``out=openai:URL``): the server URL, the KV
events endpoint and the API key variable, each checked and named beside its field, and
stored as the CLI stores them (the URL as ``engine_file``, the rest as engine arguments)."""

from __future__ import annotations

import pytest

from tests.web.admin_stack import AdminStack
from tests.web.test_deployment_routes import _create, _errors

OPENAI = {"name": "fwd", "engine": "openai", "engine_args": "{}", "url": "http://gpu-1:8000/v1"}


@pytest.mark.parametrize(
    ("changes", "errors"),
    [
        ({"url": ""}, {"url": "the server's URL is required, e.g. http://gpu-1:8000/v1"}),
        (
            {"url": "gpu-1:8000"},
            {
                "url": "out=openai:URL has URL 'gpu-1:8000'; expected http(s)://HOST[:PORT][/v1], "
                "e.g. out=openai:http://gpu-1:8000/v1"
            },
        ),
        (
            {"url": "http://gpu-1:8000/v1?key=x"},
            {
                "url": "out=openai:URL has URL 'http://gpu-1:8000/v1?key=x'; a query or "
                "fragment is not allowed"
            },
        ),
        (
            {"kv_events_endpoint": "tcp://*:5557"},
            {
                "kv_events_endpoint": "ForwardArgs 'kv_events_endpoint' has value "
                "'tcp://*:5557'; expected tcp://HOST:PORT (the address the server's "
                "--kv-events-config publishes on, with its host, not *) or ipc://PATH"
            },
        ),
        (
            {"api_key_env": "my key"},
            {
                "api_key_env": "ForwardArgs 'api_key_env' has value 'my key'; expected the name "
                "of an environment variable (letters, digits, _), e.g. UPSTREAM_API_KEY"
            },
        ),
        (
            {"kv_events_endpoint": "tcp://gpu-1:5557", "engine_args": '{"kv_events_endpoint": 1}'},
            {"kv_events_endpoint": "the engine arguments set kv_events_endpoint to 1 too"},
        ),
        (
            {"engine_args": '{"max_connections": 0}'},
            {"engine_args": "ForwardArgs 'max_connections' has value 0; expected an int >= 1"},
        ),
        (
            {"engine": "mocker", "engine_args": "{}", "api_key_env": "KEY"},
            {
                "url": "only the openai engine takes this, not mocker",
                "api_key_env": "only the openai engine takes this, not mocker",
            },
        ),
    ],
)
def test_a_wrong_openai_field_is_named_beside_it(
    stack: AdminStack, csrf: str, changes: dict[str, str], errors: dict[str, str]
) -> None:
    status, page = _create(stack, csrf, **{**OPENAI, **changes})
    assert (status, _errors(page)) == (400, errors)
    assert stack.deps.repo.list_deployments() == []
    assert f'name="url" value="{changes.get("url", OPENAI["url"])}"' in page  # kept


def test_an_openai_deployment_is_stored_like_the_cli_does(stack: AdminStack, csrf: str) -> None:
    fields = {"kv_events_endpoint": "tcp://gpu-1:5557", "api_key_env": "UPSTREAM_API_KEY"}
    engine_args = '{"upstream_model": "llama"}'
    status, _ = _create(stack, csrf, **{**OPENAI, **fields, "engine_args": engine_args})
    assert status == 303
    [stored] = stack.deps.repo.list_deployments()
    assert (stored.engine, stored.engine_file) == ("openai", "http://gpu-1:8000/v1")
    assert stored.engine_args == {"upstream_model": "llama", **fields}
    [plan] = stack.runtime.deployments
    assert plan == stored.spec()
    page = stack.client.get("/admin/deployments").text
    assert '<code class="muted small engine-url">http://gpu-1:8000/v1</code>' in page
    assert '<option value="openai" selected>' not in page  # the empty form again
    assert '<option value="openai" >openai</option>' in page
