"""``EngineActor`` in a real (in-process) Dask cluster: actor calls for control, the TCP
token stream for deltas, errors that keep their type across the actor boundary."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.actors.runtime.token_stream import (
    decode_output,
    encode_output,
    pack_request,
    unpack_kv_dump,
    unpack_request,
)
from dynask.control_plane.serving.actor_handle import ActorHandle


def _with_actor(spec: EngineSpec, body: Callable[[ActorHandle], Awaitable[None]]) -> None:
    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True, direct_to_workers=True) as client,
        ):
            proxy = await client.submit(EngineActor, spec, "actor-0", actor=True)
            info = ActorInfo.from_dict(await proxy.start())
            handle = ActorHandle(name="actor-0", deployment="d", proxy=proxy, info=info)
            await handle.connect()
            try:
                await body(handle)
            finally:
                await handle.close()
                await proxy.stop()

    asyncio.run(main())


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_echo_actor_streams_the_prompt_back(smollm2_folder: Path) -> None:
    prompt = _tokenizer(smollm2_folder).encode("The quick brown fox jumps")

    async def body(handle: ActorHandle) -> None:
        assert handle.info.stream_address.startswith("127.0.0.1:")
        assert "tokenizer.json" in handle.info.tokenizer_files
        batches = [b async for b in handle.generate("r1", prompt, SamplingParams(max_tokens=50))]
        outputs = [o for batch in batches for o in batch]
        assert [t for o in outputs for t in o.token_ids] == prompt
        assert "".join(o.text for o in outputs) == "The quick brown fox jumps"
        assert outputs[-1].usage is not None and outputs[-1].usage.completion_tokens == len(prompt)

    _with_actor(EngineSpec(kind="echo", model=str(smollm2_folder)), body)


def test_bad_sampling_params_keep_their_type_across_the_actor_call(smollm2_folder: Path) -> None:
    async def body(handle: ActorHandle) -> None:
        with pytest.raises(ValueError, match="SamplingParams 'top_p' has value 5"):
            await handle.proxy.submit(pack_request("r1", [1, 2, 3], {"top_p": 5}))
        stats = await handle.proxy.stats()
        assert (stats["num_running"], stats["num_waiting"]) == (0, 0)

    _with_actor(EngineSpec(kind="echo", model=str(smollm2_folder)), body)


@pytest.mark.parametrize(
    ("spec", "cache"),
    [
        (
            EngineSpec(
                kind="mocker",
                engine_args={
                    "num_kv_blocks": 300,
                    "block_size": 32,
                    "prefix_cache_protected_share": 0.25,
                },
            ),
            (9600, 0.25),
        ),
        (EngineSpec(kind="mocker", engine_args={"num_kv_blocks": 64}), (64 * 16, 0.5)),
        (EngineSpec(kind="echo"), (None, 0.0)),
    ],
    ids=["mocker-segmented", "mocker-defaults", "echo"],
)
def test_info_describes_the_kv_cache_as_approximate_routing_models_it(
    spec: EngineSpec, cache: tuple[int | None, float]
) -> None:
    async def body(handle: ActorHandle) -> None:
        assert (handle.info.kv_cache_tokens, handle.info.kv_protected_share) == cache

    _with_actor(spec, body)


def test_leaving_a_stream_early_aborts_and_frees_blocks(smollm2_folder: Path) -> None:
    spec = EngineSpec(
        kind="mocker",
        model=str(smollm2_folder),
        # ~6 ms a token: the stream is surely still running when it is left, even under load
        engine_args={"speedup_ratio": 1.0, "num_kv_blocks": 64},
    )

    async def body(handle: ActorHandle) -> None:
        stream = handle.generate(
            "r1", list(range(100, 140)), SamplingParams(max_tokens=500, ignore_eos=True)
        )
        received = 0
        async for _ in stream:
            received += 1
            if received == 3:
                break
        await stream.aclose()  # what a client disconnect does to the SSE generator
        deadline = time.monotonic() + 60  # generous: the machine may be loaded
        stats = await handle.proxy.stats()
        while stats["num_running"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            stats = await handle.proxy.stats()
        assert (stats["num_running"], stats["kv_usage"], stats["num_free_kv_blocks"]) == (
            0,
            0.0,
            64,
        )
        dump = unpack_kv_dump(await handle.proxy.kv_cache_dump())
        assert len(dump.stored) == 40 // 16  # the prompt's full blocks stay cached
        assert dump.last_event_id == 1  # one BlockStored: the prefill step's two blocks

    _with_actor(spec, body)


def test_outputs_survive_the_wire_format() -> None:
    output = RequestOutput("r-1", "héllo", (5, 6), FinishReason.STOP, "</s>", Usage(3, 2, 1))
    assert decode_output(encode_output(output)) == output
    partial = RequestOutput("r-2", "", (7,))
    assert decode_output(encode_output(partial)) == partial


def test_requests_survive_the_wire_format() -> None:
    params = {"max_tokens": 5, "stop": ["</s>"], "temperature": 0.5}
    assert unpack_request(pack_request("r-9", [0, 7, 49151], params)) == (
        "r-9",
        [0, 7, 49151],
        params,
    )


class _CountingProxy:
    """The real actor proxy, counting ``submit_batch`` calls and their sizes."""

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy
        self.batch_sizes: list[int] = []

    async def submit_batch(self, payload: bytes) -> list[str | None]:
        from dynask.actors.runtime.token_stream import unpack_requests

        self.batch_sizes.append(len(unpack_requests(payload)))
        errors: list[str | None] = await self._proxy.submit_batch(payload)
        return errors


def test_concurrent_submissions_share_actor_calls_and_a_bad_one_fails_alone(
    smollm2_folder: Path,
) -> None:
    from dynask.control_plane.serving.submit_batcher import SubmitBatcher

    async def body(handle: ActorHandle) -> None:
        counting = _CountingProxy(handle.proxy)
        batcher = SubmitBatcher(counting, "actor-0")
        good = [batcher.submit(pack_request("r0", [1, 2, 3], {"max_tokens": 1}))]
        await asyncio.sleep(0)  # the first call is now in flight
        good += [
            batcher.submit(pack_request(f"r{i}", [1, 2, 3], {"max_tokens": 1})) for i in range(1, 9)
        ]
        bad = batcher.submit(pack_request("bad", [1, 2, 3], {"top_p": 5}))
        results = await asyncio.gather(*good, bad, return_exceptions=True)
        assert results[:9] == [None] * 9
        assert isinstance(results[9], ValueError) and "top_p" in str(results[9])
        # The first call carries one request; the rest queued meanwhile and go together.
        assert counting.batch_sizes == [1, 9]

    _with_actor(EngineSpec(kind="echo", model=str(smollm2_folder)), body)


def test_kv_events_reach_the_reader_before_the_deltas_of_their_step() -> None:
    from dynask.actors.runtime.token_stream import TokenStreamServer, read_frame
    from dynask.kv.events import AllBlocksCleared, KVEventLog

    async def main() -> None:
        server = TokenStreamServer(asyncio.get_running_loop())
        kv_log = KVEventLog()
        server.watch_kv_events(kv_log)
        host, port = (await server.start("127.0.0.1")).rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        while server.num_readers == 0:
            await asyncio.sleep(0.001)

        def engine_step() -> None:  # on another thread, as the engine's loop runs
            kv_log.record(AllBlocksCleared())
            kv_log.record(AllBlocksCleared())
            server.publish([RequestOutput("r1", "hi", (7,))])

        await asyncio.to_thread(engine_step)
        # The loop may flush the first event before the second is recorded (two "kv"
        # frames); either way every event of the step comes before the step's outputs.
        frames = [await read_frame(reader)]
        while frames[-1][0] != "out":
            frames.append(await read_frame(reader))
        assert {kind for kind, _ in frames[:-1]} == {"kv"}
        assert [record["event_id"] for _, records in frames[:-1] for record in records] == [1, 2]
        writer.close()
        await writer.wait_closed()
        while server.num_readers:  # the server saw us leave
            await asyncio.sleep(0.001)
        await server.close()

    asyncio.run(main())


def test_a_kv_cache_dump_survives_the_wire_and_garbage_is_refused() -> None:
    from dynask.actors.runtime.token_stream import pack_kv_dump
    from dynask.kv.events import BlockStored
    from dynask.kv.hashing import SequenceHash
    from dynask.kv.prefix_index import KVCacheDump

    dump = KVCacheDump(
        3, (BlockStored.from_token_ids((SequenceHash(2**64 - 1),), None, (1, 2), 2),)
    )
    assert unpack_kv_dump(pack_kv_dump(dump)) == dump
    with pytest.raises(ValueError, match="a KV cache dump must be a msgpack map, got list"):
        unpack_kv_dump(b"\x91\x01")


def test_an_actor_freed_without_stop_stops_its_engine_thread(smollm2_folder: Path) -> None:
    def echo_threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "dynask-echo")

    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True, direct_to_workers=True) as client,
        ):
            before = echo_threads()
            future = client.submit(EngineActor, EngineSpec(kind="echo"), "freed-0", actor=True)
            proxy = await future
            await proxy.start()
            assert echo_threads() == before + 1
            del proxy
            future.release()  # what a control plane that died leaves behind
            deadline = time.monotonic() + 30
            while echo_threads() > before and time.monotonic() < deadline:
                gc.collect()
                await asyncio.sleep(0.1)
            assert echo_threads() == before

    asyncio.run(main())


def test_requests_whose_stream_lost_its_last_reader_are_aborted() -> None:
    spec = EngineSpec(kind="echo", engine_args={"delay_s": 0.05})  # 400 tokens: 20 s

    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True, direct_to_workers=True) as client,
        ):
            proxy = await client.submit(EngineActor, spec, "unread-0", actor=True)
            info = ActorInfo.from_dict(await proxy.start())
            handle = ActorHandle(name="unread-0", deployment="d", proxy=proxy, info=info)
            await handle.connect()
            stream = handle.generate("r1", list(range(100, 500)), SamplingParams(max_tokens=400))
            await anext(stream)  # running, its deltas arriving
            await handle.close()  # the control plane is gone: nobody reads the deltas
            deadline = time.monotonic() + 10
            while (await proxy.stats())["num_running"] and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert (await proxy.stats())["num_running"] == 0
            await proxy.stop()

    asyncio.run(main())


def test_a_readers_departure_aborts_its_requests_and_frees_their_blocks_only(
    tiny_llama_folder: Path,
) -> None:
    """Two control planes in front of one actor: the one that goes away (its stream
    closes, as when its process is killed) takes exactly its own requests with it; their
    KV blocks are free at once, and the other one's request runs on to its end."""
    spec = EngineSpec(
        kind="torch", model=str(tiny_llama_folder), engine_args={"kv_cache_gib": 0.05}
    )

    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True, direct_to_workers=True) as client,
        ):
            proxy = await client.submit(EngineActor, spec, "shared-0", actor=True)
            info = ActorInfo.from_dict(await proxy.start())
            dying, staying = (
                ActorHandle(name="shared-0", deployment="d", proxy=proxy, info=info)
                for _ in range(2)
            )
            await dying.connect()
            await staying.connect()
            params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
            kept = staying.generate("kept", list(range(100, 150)), params)
            gone = [dying.generate(f"gone{i}", list(range(200 + i, 250)), params) for i in (0, 1)]
            first = await anext(kept)  # under load a first delta may hold several tokens
            for stream in gone:
                await anext(stream)
            held = (await proxy.stats())["num_free_kv_blocks"]
            assert (await proxy.stats())["num_running"] == 3

            await dying.close()  # its process is gone: nobody reads its deltas
            deadline = time.monotonic() + 10
            while (await proxy.stats())["num_running"] > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            stats = await proxy.stats()
            assert stats["num_running"] == 1  # the other control plane's request runs on
            assert stats["num_free_kv_blocks"] > held  # the dead one's blocks are free
            tokens = sum(len(o.token_ids) for o in first)
            async for outputs in kept:
                tokens += sum(len(o.token_ids) for o in outputs)
            assert tokens == 400  # every token
            await staying.close()
            stats = await proxy.stats()
            assert stats["num_running"] == 0 and stats["kv_usage"] == 0.0  # nothing held
            await proxy.stop()

    asyncio.run(main())


def test_an_engine_actor_stops_its_workers_profiler(smollm2_folder: Path) -> None:
    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True) as client,
        ):
            worker = next(iter(cluster.workers.values()))
            profiler = worker.periodic_callbacks["profile"]
            assert profiler.is_running()
            spec = EngineSpec(kind="echo", model=str(smollm2_folder))
            proxy = await client.submit(EngineActor, spec, "actor-0", actor=True)
            await proxy.start()
            try:
                assert not profiler.is_running()
                assert not worker.periodic_callbacks["profile-cycle"].is_running()
                assert worker.periodic_callbacks["heartbeat"].is_running()
            finally:
                await proxy.stop()

    asyncio.run(main())


def test_a_torch_engines_worker_hands_the_gil_over_every_half_millisecond() -> None:
    # The engine thread's hand-offs to the worker's loop waited up to Python's 5 ms switch
    # interval (H200: p99 18.5 ms at 16 streams; 5.5 ms at 0.5 ms). Never lengthened.
    import sys

    from dynask.actors.runtime import engine_actor

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        engine_actor._hand_the_gil_over_sooner()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        sys.setswitchinterval(0.0002)  # someone chose shorter: kept
        engine_actor._hand_the_gil_over_sooner()
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    finally:
        sys.setswitchinterval(before)
