"""deploy/observability/ against a real Prometheus scraping a real ``dynask run``.

Prometheus (Debian's package) scrapes a ``dynask run`` (the built-in engine with a host
KV tier, API keys required) every second while clients stream requests; once it has
scraped twice and evaluated its rules, every PromQL query of the Grafana dashboard and
every rule's expression runs through Prometheus's HTTP API and must return a series (a
panel naming a metric that does not exist, or a typo in a label, returns none).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.control_plane import server_process as sp
from tests.system_tools import require

OBSERVABILITY = Path(__file__).resolve().parents[2] / "deploy" / "observability"
RULES = OBSERVABILITY / "dynask-rules.yml"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
MODEL = "mock"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every dashboard target, Grafana's variables filled in as
    Grafana would for "All" models and a 1 s scrape interval."""
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "30s").replace("$model", ".*")
            found.append((panel["title"], expr))
    return found


def rule_queries() -> list[tuple[str, str]]:
    """(rule name, PromQL) of every rule. An alert's final comparison becomes a ``bool``
    one, so the query returns its series (0 or 1) whether or not the alert fires."""
    found = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            if "alert" in rule:
                expr, n = re.subn(r"\s(==|!=|>=|<=|>|<)\s*([0-9.]+)\s*$", r" \1 bool \2", expr)
                assert n == 1, f"alert {rule['alert']}: no final comparison in {expr!r}"
            found.append((rule.get("record") or rule["alert"], expr))
    return found


def test_the_dashboard_and_rules_have_what_the_issue_lists() -> None:
    names = {name for name, _ in rule_queries()}
    assert {
        "DynaskHighTimeToFirstToken",
        "DynaskHighInterTokenLatency",
        "DynaskKVCacheNearFull",
        "DynaskSheddingRequests",
        "DynaskEngineActorsLost",
        "DynaskMigrationsRefused",
        "DynaskAdmissionRefusing",
        "DynaskDown",
    } <= names
    text = " ".join(expr for _, expr in dashboard_queries())
    for metric in (
        "dynask_requests_total",
        "dynask_time_to_first_token_seconds_bucket",
        "dynask_inter_token_latency_seconds_bucket",
        "dynask_output_tokens_total",
        "dynask_actor_kv_usage_ratio",
        "dynask_actor_kv_tier_hit_ratio",
        "dynask_routing_decisions_total",
        "dynask_routing_overlap_blocks_sum",
        "dynask_disagg_prefills_total",
        "dynask_disagg_kv_transferred_blocks_total",
        "dynask_migrations_total",
        "dynask_admission_refused_total",
        "dynask_api_key_requests_total",
    ):
        assert metric in text, metric


def test_promtool_accepts_the_rules_and_the_config() -> None:
    promtool = require("promtool")
    for args in (["check", "rules", str(RULES)], ["check", "config", "prometheus.yml"]):
        done = subprocess.run(
            [promtool, *args], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


# ---- the real thing ----------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("observability")


@pytest.fixture(scope="module")
def dynask(folder: Path) -> Iterator[tuple[str, str]]:
    """(base URL, API key) of a ``dynask run``: the built-in engine with the bundled
    SmolLM2 and a host-memory KV tier (the mocker has no tiers), one worker."""
    database = f"sqlite:///{folder / 'state.db'}"
    done = subprocess.run(
        [str(sp.BIN / "dynask"), "keys", "create", "grafana", "--database-url", database],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    key = done.stdout.strip()
    args = [
        "--model-name",
        MODEL,
        "--workers",
        "1",
        "--kv-host-gb",
        "0.05",
        "--max-model-len",
        "512",
    ]
    with sp.dynask_run(folder, [*args, "--require-api-key"]) as (base, _):
        sp.wait_for_engines(base, 1, api_key=key)
        yield base, key


@pytest.fixture(scope="module")
def traffic(dynask: tuple[str, str]) -> Iterator[None]:
    """Two clients streaming chat requests with a shared prefix, until the module ends."""
    base, key = dynask
    stop = threading.Event()
    errors: list[BaseException] = []

    def client(n: int) -> None:
        llm = openai.OpenAI(base_url=f"{base}/v1", api_key=key, timeout=60, max_retries=0)
        i = 0
        while not stop.is_set():
            i += 1
            system = "You are a terse assistant that answers in one line. " * 8
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"client {n} question {i % 5}"},
            ]
            try:
                stream = llm.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=12,
                    stream=True,  # type: ignore[arg-type]
                )
                for _ in stream:
                    pass
            except openai.APIError as exc:  # pragma: no cover - reported by the test
                errors.append(exc)
                return

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(2)]
    for thread in threads:
        thread.start()
    yield
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors


@pytest.fixture(scope="module")
def prometheus(folder: Path, dynask: tuple[str, str], traffic: None) -> Iterator[str]:
    """A real Prometheus with the shipped config (target and intervals set for the test)
    and rules; yields its URL once it scraped dynask twice and evaluated every rule."""
    binary = require("prometheus")
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES)]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [dynask[0].split("//")[1]]}]
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = sp.free_port()
    log = folder / "prometheus.log"
    argv = [binary, f"--config.file={path}", f"--storage.tsdb.path={folder / 'tsdb'}"]
    argv += [f"--web.listen-address=127.0.0.1:{port}"]
    proc = sp.start(argv, log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield url
    finally:
        sp.stop(proc)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{log.read_text()[-3000:]}")
        try:
            # Starting up (replaying its log), Prometheus answers 503 "Service Unavailable".
            if httpx.get(f"{url}/-/ready", timeout=10).status_code != 200:
                time.sleep(0.25)
                continue
            # Two scrapes of dynask (and time for a rate over them to see the traffic),
            # then every rule evaluated at least once without error.
            scrapes = _query(url, 'count_over_time(up{job="dynask"}[1m])')
            if scrapes and float(scrapes[0]["value"][1]) >= 5 and _rules_evaluated(url):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"prometheus did not scrape and evaluate in {timeout}s:\n{log.read_text()}")


def _rules_evaluated(url: str) -> bool:
    groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    return bool(rules) and all(
        rule["health"] == "ok" and not rule["lastEvaluation"].startswith("0001") for rule in rules
    )


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert answer["status"] == "success", (expr, answer)
    return list(answer["data"]["result"])


@pytest.mark.slow
def test_every_panel_and_rule_returns_data(prometheus: str) -> None:
    empty = [
        f"{name}: {expr}"
        for name, expr in [*dashboard_queries(), *rule_queries()]
        if not _query(prometheus, expr)
    ]
    assert empty == []


@pytest.mark.slow
def test_the_target_is_up_and_the_rules_loaded(prometheus: str) -> None:
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]
    assert [(t["labels"]["job"], t["health"]) for t in targets["activeTargets"]] == [
        ("dynask", "up")
    ]
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    assert loaded == {name for name, _ in rule_queries()}
    # The traffic is seen: requests were counted and the per-key counter names our key.
    rate = _query(prometheus, 'sum(dynask:requests:rate1m{status="ok"})')
    assert float(rate[0]["value"][1]) > 0
    keys = _query(prometheus, "dynask_api_key_requests_total")
    assert [k["metric"]["key"] for k in keys] == [keys[0]["metric"]["key"]]
    assert keys[0]["metric"]["key"].startswith("dsk_")
