"""``/v1`` behind the API-key guard: 401 in OpenAI's shape, the official client with a key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from dynask.control_plane.api.app import build_app
from dynask.control_plane.api.key_guard import (
    INVALID_KEY_MESSAGE,
    MISSING_KEY_MESSAGE,
    ApiKeyGuard,
    RequireApiKey,
    bearer_key,
)
from dynask.control_plane.server import ControlPlane, ServerOptions
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.api_keys import ApiKeys
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.deployment import DeploymentSpec

REFRESH_S = 2.0


class CountingKeys(ApiKeys):
    loads = 0

    def active_tenants(self):  # type: ignore[no-untyped-def]
        self.loads += 1
        return super().active_tenants()


@dataclass
class Guarded:
    keys: CountingKeys
    guard: ApiKeyGuard
    client: TestClient
    now: list[float]
    metrics: ServingMetrics


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Guarded]:
    engine = make_engine(f"sqlite:///{tmp_path / 'keys.db'}")
    upgrade(engine)
    keys = CountingKeys(engine)
    now = [100.0]
    guard = ApiKeyGuard(keys, REFRESH_S, clock=lambda: now[0])
    metrics = ServingMetrics()
    middleware = [Middleware(RequireApiKey, guard=guard, metrics=metrics)]
    app = build_app(ServingService(metrics), middleware=middleware)
    with TestClient(app) as client:
        yield Guarded(keys, guard, client, now, metrics)
    engine.dispose()


def _error(message: str) -> dict[str, object]:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def test_a_missing_key_gets_401_saying_what_to_do(guarded: Guarded) -> None:
    response = guarded.client.get("/v1/models")
    assert response.status_code == 401
    assert response.json() == _error(MISSING_KEY_MESSAGE)
    assert response.headers["www-authenticate"] == "Bearer"
    assert "dynask keys create NAME" in MISSING_KEY_MESSAGE


def test_a_wrong_key_gets_401(guarded: Guarded) -> None:
    guarded.keys.create("app", "test")
    response = guarded.client.get("/v1/models", headers={"authorization": "Bearer dsk_wrong"})
    assert (response.status_code, response.json()) == (401, _error(INVALID_KEY_MESSAGE))


def test_emptying_the_engines_caches_needs_a_key(guarded: Guarded) -> None:
    key = guarded.keys.create("ops", "test").key
    response = guarded.client.post("/v1/engines/reset_prefix_cache")
    assert (response.status_code, response.json()) == (401, _error(MISSING_KEY_MESSAGE))

    allowed = guarded.client.post(
        "/v1/engines/reset_prefix_cache", headers={"authorization": f"Bearer {key}"}
    )
    assert (allowed.status_code, allowed.json()) == (200, {"reset": True, "engines": []})


@pytest.mark.parametrize("path", ["/health", "/live", "/metrics", "/openapi.json"])
def test_operational_routes_stay_open(guarded: Guarded, path: str) -> None:
    assert guarded.client.get(path).status_code in (200, 503)  # /health: 503, no engines
    assert guarded.keys.loads == 0


def test_the_official_client_with_a_valid_key(guarded: Guarded) -> None:
    key = guarded.keys.create("app", "test").key
    client = openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=guarded.client, max_retries=0
    )
    assert client.models.list().data == []
    with pytest.raises(openai.AuthenticationError) as raised:
        openai.OpenAI(
            base_url="http://testserver/v1",
            api_key="dsk_wrong",
            http_client=guarded.client,
            max_retries=0,
        ).models.list()
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"


def test_requests_count_against_the_key_prefix(guarded: Guarded) -> None:
    created = guarded.keys.create("app", "test")
    for key in (created.key, created.key, "dsk_wrong"):
        guarded.client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
    text = guarded.metrics.render().decode()
    lines = [line for line in text.splitlines() if line.startswith("dynask_api_key_requests_total")]
    assert lines == [f'dynask_api_key_requests_total{{key="{created.key[:12]}"}} 2.0']
    assert created.key[:12] == created.record.prefix


def test_keys_load_once_per_refresh_and_a_revoked_key_fails_after_it(guarded: Guarded) -> None:
    key = guarded.keys.create("app", "test").key
    auth = {"authorization": f"Bearer {key}"}
    for _ in range(5):
        assert guarded.client.get("/v1/models", headers=auth).status_code == 200
    assert guarded.keys.loads == 1  # a dict lookup per request, not a query

    guarded.keys.revoke(key[:12], "test")
    assert guarded.client.get("/v1/models", headers=auth).status_code == 200  # cached
    guarded.now[0] += REFRESH_S  # stale: the next request starts a reload in the background
    deadline = time.monotonic() + 5
    while guarded.client.get("/v1/models", headers=auth).status_code == 200:
        assert time.monotonic() < deadline, "the revoked key was still accepted"
        time.sleep(0.01)
    assert guarded.keys.loads == 2
    [record] = guarded.keys.list()
    assert record.last_used_at is not None  # written at the reload, not per request


def test_a_session_key_expires(guarded: Guarded) -> None:
    key = guarded.guard.mint_session_key(ttl_s=10)
    auth = {"authorization": f"Bearer {key}"}
    assert guarded.client.get("/v1/models", headers=auth).status_code == 200
    guarded.now[0] += 10
    assert guarded.client.get("/v1/models", headers=auth).status_code == 401


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ([(b"authorization", b"Bearer dsk_x")], "dsk_x"),
        ([(b"authorization", b"bearer  dsk_x ")], "dsk_x"),
        ([(b"authorization", b"Basic dsk_x")], None),
        ([(b"authorization", b"Bearer ")], None),
        ([(b"accept", b"*/*")], None),
    ],
)
def test_bearer_key(headers: list[tuple[bytes, bytes]], key: str | None) -> None:
    assert bearer_key(headers) == key


def test_a_control_plane_without_keys_says_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'cp.db'}"
    plan = DeploymentSpec("echo", engine="echo")
    control_plane = ControlPlane([plan], ServerOptions(database_url=db, require_api_key=True))
    control_plane.announce_keys()
    assert capsys.readouterr().err == (
        "dynask: /v1 requires an API key and none exists yet; create one with\n"
        f"  dynask keys create NAME --database-url '{db}'\n"
        "  (or on the admin UI's API keys page; start with --no-require-api-key to serve "
        "without keys)\n"
    )
    control_plane.api_keys.create("app", "test")
    control_plane.announce_keys()
    assert capsys.readouterr().err == (
        "dynask: /v1 requires an API key (Authorization: Bearer KEY)\n"
    )
    client = TestClient(control_plane.app)  # not entered: no lifespan, no cluster
    assert client.get("/health").status_code == 503  # open, no engines yet
    assert client.get("/v1/models").status_code == 401
    control_plane.repo.engine.dispose()


def test_keys_that_cannot_be_loaded_give_503(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'never-migrated.db'}")  # no api_keys table
    guard = ApiKeyGuard(ApiKeys(engine))
    app = build_app(
        ServingService(ServingMetrics()), middleware=[Middleware(RequireApiKey, guard=guard)]
    )
    with TestClient(app) as client:
        response = client.get("/v1/models", headers={"authorization": "Bearer dsk_x"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "api_keys_unavailable"
    assert error["message"].startswith("API keys could not be loaded from the database: ")
    engine.dispose()


def test_the_anthropic_client_sends_its_key_as_x_api_key(guarded: Guarded) -> None:
    import anthropic

    key = guarded.keys.create("app", "test").key

    def client(api_key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url="http://testserver", api_key=api_key, http_client=guarded.client, max_retries=0
        )

    ask: Any = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.NotFoundError) as passed:  # past the guard: no such model
        client(key).messages.create(**ask)
    assert isinstance(passed.value.body, dict) and passed.value.body["type"] == "error"
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client("dsk_wrong").messages.create(**ask)
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": INVALID_KEY_MESSAGE},
    }
