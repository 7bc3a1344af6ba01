"""A tiny OTLP/HTTP trace collector: ``POST /v1/traces`` (protobuf), spans kept in memory.

What the tracing test and the tracing-overhead benchmark export engine spans to (the
real OTLP exporter, over a real socket), so neither needs an OpenTelemetry Collector.
It answers 200 with an empty ``ExportTraceServiceResponse``, as a collector does.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, its ids in lowercase hex as in a ``traceparent``."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    service: str
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    events: tuple[str, ...] = field(default=())


class OtlpReceiver:
    """Serves on 127.0.0.1 (a free port) until ``close``; ``spans`` grows as exports come."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._add(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: tests and benchmarks print their own

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The traces URL an ``OTLPSpanExporter`` takes as ``endpoint``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            service=str(resource.get("service.name", "")),
                            status_code=span.status.code,
                            events=tuple(e.name for e in span.events),
                        )
                    )
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1

    def wait_for(self, count: int, timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """The spans once at least ``count`` have arrived; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(
            f"{len(self.spans)} spans reached the collector in {timeout_s} s; expected {count}: "
            f"{[s.name for s in self.spans]}"
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None
