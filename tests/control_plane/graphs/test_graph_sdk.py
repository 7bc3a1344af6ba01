"""The graph SDK and its YAML: depends/link, merging Common, and mistakes named precisely."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynask.control_plane.graphs.components import Frontend, Processor, Worker
from dynask.control_plane.graphs.config import plan_graph
from dynask.control_plane.graphs.runtime import load_graph_plan
from dynask.control_plane.graphs.sdk import build_graph, depends, service, unlink_all

GRAPHS = Path(__file__).resolve().parents[3] / "deploy" / "graphs"


@service(workers=3, resources={"gpu": 1})
class Engine(Worker):
    pass


class Rewriter(Processor):
    engine = depends(Engine)

    def process(self, request: dict[str, object]) -> dict[str, object]:
        return request


class MyFrontend(Frontend):
    pass


@pytest.fixture(autouse=True)
def clean_links() -> None:
    unlink_all(Frontend, MyFrontend, Processor, Rewriter, Worker, Engine)


def test_link_chains_and_builds_the_graph_in_walk_order() -> None:
    assert MyFrontend.link(Rewriter).link(Engine) is Engine

    graph = build_graph(MyFrontend)

    assert graph.names() == ["MyFrontend", "Rewriter", "Engine"]
    assert graph.describe()["links"] == [["MyFrontend", "Rewriter"], ["Rewriter", "Engine"]]
    assert graph.describe()["components"][2]["workers"] == 3
    assert Frontend.__dict__["_dynask_links"] == []  # a subclass's links are its own


def test_a_dependency_outside_the_graph_is_named() -> None:
    MyFrontend.link(Rewriter)
    with pytest.raises(ValueError, match=r"Rewriter.engine depends on Engine, which is not in"):
        build_graph(MyFrontend)


def test_a_dependency_is_a_handle_only_when_wired() -> None:
    rewriter = Rewriter({})
    with pytest.raises(RuntimeError, match="is not wired"):
        _ = rewriter.engine
    rewriter.__dict__["_dynask_handles"] = {"engine": "handle"}
    assert rewriter.engine == "handle"


def test_unmarked_classes_and_bad_resources_are_refused() -> None:
    class Plain:
        pass

    with pytest.raises(ValueError, match="Plain is not a graph component"):
        MyFrontend.link(Plain)
    with pytest.raises(ValueError, match="resource 'gpu' has value 2"):
        service(resources={"gpu": 2})


def _plan(yaml_text: str, tmp_path: Path) -> object:
    MyFrontend.link(Rewriter).link(Engine)
    import yaml

    return plan_graph(build_graph(MyFrontend), "x.py:MyFrontend", yaml.safe_load(yaml_text), "c")


def test_common_configs_merge_and_own_keys_win(tmp_path: Path) -> None:
    plan = _plan(
        "Common: {engine: echo, max-model-len: 64, delay-s: 0.5}\n"
        "MyFrontend: {served_model_name: m, port: 9000}\n"
        "Rewriter: {router: round-robin, prefix: 'X '}\n"
        "Engine:\n  delay-s: 0.1\n  common-configs: [engine, max-model-len, delay-s]\n"
        "  ServiceArgs: {workers: 2}\n",
        tmp_path,
    )
    (deployment,) = plan.deployments  # type: ignore[attr-defined]
    assert deployment.name == "x-engine" and deployment.served_model_name == "m"
    assert deployment.replicas == 2 and deployment.engine == "echo"
    assert deployment.engine_args == {"max_model_len": 64, "delay_s": 0.1}
    assert plan.routing == {"mode": "round-robin"}  # type: ignore[attr-defined]
    assert plan.processor is Rewriter  # type: ignore[attr-defined]
    assert plan.processor_config == {"prefix": "X "}  # type: ignore[attr-defined]
    assert plan.frontend == {"served_model_name": "m", "port": 9000}  # type: ignore[attr-defined]
    handle = plan.processor_handles["engine"]  # type: ignore[attr-defined]
    assert (handle.deployment, handle.model) == ("x-engine", "m")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("VllmWorker: {}", "section 'VllmWorker' names no component"),
        ("Engine: {common-configs: [model]}", "Engine 'common-configs' names 'model'"),
        ("Engine: {engine: echo, speed: 2}", "Engine: engine argument 'speed' is not known"),
        ("Engine: {ServiceArgs: {workers: -1}}", "Engine ServiceArgs 'workers' has value -1"),
        ("Engine: {ServiceArgs: {cpus: 1}}", "Engine ServiceArgs has unknown key 'cpus'"),
        ("Engine: {role: both}", "Engine 'role' has value 'both'"),
        ("Rewriter: {router: fastest}", "Rewriter 'router' has value 'fastest'"),
        ("MyFrontend: {portt: 1}", "MyFrontend has unknown key 'portt'"),
        ("Common: [1]", "'Common' must be a mapping"),
    ],
)
def test_mistakes_name_the_component_key_and_value(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        _plan(text, tmp_path)
    assert message in str(caught.value)


@pytest.mark.parametrize("name", ["agg", "disagg", "agg_rewrite"])
def test_the_shipped_graphs_and_their_yaml_validate(name: str) -> None:
    plan = load_graph_plan(f"{GRAPHS / name}.py:Frontend", str(GRAPHS / f"{name}.yaml"))

    roles = sorted(d.role for d in plan.deployments)
    assert roles == (["decode", "prefill"] if name == "disagg" else ["aggregated"])
    assert all(d.served_model_name == "smollm2" for d in plan.deployments)
    assert (plan.processor is not None) == (name == "agg_rewrite")
    links = plan.description["links"]
    assert links[0][0] == "Frontend" and len(links) == len(plan.description["components"]) - 1


def test_a_bad_target_says_what_form_it_takes() -> None:
    with pytest.raises(ValueError, match="is not MODULE:Component"):
        load_graph_plan("graphs.agg", str(GRAPHS / "agg.yaml"))
    with pytest.raises(ValueError, match="has no component class 'Front'"):
        load_graph_plan(f"{GRAPHS / 'agg.py'}:Front", str(GRAPHS / "agg.yaml"))


def test_serve_with_a_graph_target_needs_its_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    from dynask.control_plane.cli.main import main

    target = f"{GRAPHS / 'agg.py'}:Frontend"
    assert main(["serve", target, "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "needs the graph's settings: add -f CONFIG.yaml" in capsys.readouterr().err
