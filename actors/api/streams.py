"""The per-request output stream a caller reads while the engine thread writes."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

from dynask.actors.api.outputs import RequestOutput, TokenLogprob, Usage

OutputListener = Callable[[list[RequestOutput]], None]


class RequestStream:
    """Deltas of one request, in order; iterate it, or ``wait()`` for the whole result.

    Every delta received is kept, so iterating after ``wait()`` still yields them all.
    """

    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self._queue: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
        self.received: list[RequestOutput] = []

    def put(self, output: RequestOutput) -> None:
        """Called by the engine thread."""
        self._queue.put(output)

    def __iter__(self) -> Iterator[RequestOutput]:
        index = 0
        while True:
            while index < len(self.received):
                yield self.received[index]
                index += 1
            if self.received and self.received[-1].finished:
                return
            self._pull(timeout=None)

    def wait(self, timeout: float | None = None) -> None:
        """Blocks until the final delta has arrived; ``queue.Empty`` after ``timeout``."""
        while not self.finished:
            self._pull(timeout)

    def _pull(self, timeout: float | None) -> None:
        self.received.append(self._queue.get(timeout=timeout))

    def _drain(self) -> list[RequestOutput]:
        """Moves what has arrived into ``received`` (without waiting) and returns it."""
        while not self._queue.empty():
            self.received.append(self._queue.get_nowait())
        return self.received

    @property
    def finished(self) -> bool:
        received = self._drain()
        return bool(received) and received[-1].finished

    @property
    def text(self) -> str:
        return "".join(o.text for o in self._drain())

    @property
    def token_ids(self) -> list[int]:
        return [t for o in self._drain() for t in o.token_ids]

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """One per generated token (empty unless the request asked for logprobs)."""
        return [lp for o in self._drain() for lp in o.logprobs or ()]

    @property
    def finish_reason(self) -> str | None:
        received = self._drain()
        last = received[-1] if received else None
        return last.finish_reason.value if last and last.finish_reason else None

    @property
    def usage(self) -> Usage | None:
        received = self._drain()
        return received[-1].usage if received else None


class OutputFanout:
    """Hands each step's deltas to the request streams and to every output listener."""

    def __init__(self) -> None:
        self._streams: dict[str, RequestStream] = {}
        self._listeners: list[OutputListener] = []

    def open_stream(self, request_id: str, num_prompt_tokens: int) -> RequestStream:
        """A stream that will receive ``request_id``'s deltas."""
        stream = RequestStream(request_id, num_prompt_tokens)
        self._streams[request_id] = stream
        return stream

    def add_listener(self, listener: OutputListener) -> None:
        self._listeners.append(listener)

    def publish(self, outputs: list[RequestOutput]) -> None:
        """One call per listener with all of ``outputs``; nothing when there are none."""
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put(output)
                if output.finished:
                    del self._streams[output.request_id]
        if outputs:
            for listener in self._listeners:
                listener(outputs)
