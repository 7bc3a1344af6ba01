"""Tracing's options: where traces go, the flags, and off by default."""

from __future__ import annotations

import pytest
from opentelemetry.trace import NoOpTracer

from dynask.control_plane.cli.main import _parser
from dynask.control_plane.observability.tracing import Tracing, TracingOptions


def test_the_traces_url_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert TracingOptions().traces_url() is None
    assert TracingOptions("http://c:4318").traces_url() == "http://c:4318/v1/traces"
    assert TracingOptions("http://c:4318/").traces_url() == "http://c:4318/v1/traces"
    assert TracingOptions("http://c:4318/v1/traces").traces_url() == "http://c:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel.example:4318")
    assert TracingOptions().traces_url() == "https://otel.example:4318/v1/traces"
    assert TracingOptions("http://c:4318").traces_url() == "http://c:4318/v1/traces"


def test_a_bad_endpoint_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as error:
        TracingOptions("c:4318")
    assert str(error.value) == (
        "TracingOptions 'otel_endpoint' has value 'c:4318'; expected an http:// or https:// "
        "URL of an OTLP/HTTP collector"
    )


def test_off_by_default_with_the_no_op_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    off = Tracing.from_options(TracingOptions())
    assert (off.enabled, off.worker_plugin, type(off.tracer)) == (False, None, NoOpTracer)
    on = Tracing.from_options(TracingOptions("http://127.0.0.1:4318", "svc"))
    try:
        assert on.enabled
        assert on.worker_plugin is not None
        assert (on.worker_plugin.endpoint, on.worker_plugin.service_name) == (
            "http://127.0.0.1:4318/v1/traces",
            "svc-engine",
        )
    finally:
        on.shutdown()


@pytest.mark.parametrize("command", [["run"], ["serve", "--scheduler", "tcp://h:8786"]])
def test_run_and_serve_take_the_tracing_flags(command: list[str]) -> None:
    args = _parser().parse_args(
        [*command, "--otel-endpoint", "http://c:4318", "--otel-service-name", "edge"]
    )
    assert (args.otel_endpoint, args.otel_service_name) == ("http://c:4318", "edge")
