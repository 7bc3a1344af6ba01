"""Observability of the control plane: OpenTelemetry traces of each request (``tracing``:
options, the tracer provider, the spans' attributes; ``http_tracing``: the HTTP span and
the client's ``traceparent``). The engine side lives in ``actors.runtime.tracing``.
It imports only ``actors.runtime`` and OpenTelemetry, so every other control-plane package
may use it.
"""
