"""``deploy.yaml`` parsing: the shipped example, and mistakes named precisely."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynask.control_plane.cluster.deploy_file import read_deploy_file

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "deploy.yaml"


def test_the_shipped_example_parses() -> None:
    plans = read_deploy_file(str(EXAMPLE))

    assert [(p.name, p.served_model_name, p.engine, p.replicas) for p in plans] == [
        ("smollm2", "smollm2", "torch", 2),
        ("mock", "mock", "mocker", 0),
    ]
    assert plans[0].engine_args == {"kv_cache_gib": 1.0, "max_num_seqs": 64}
    assert plans[0].model_path is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("deployments: []", "needs a non-empty 'deployments' list"),
        ("deployments:\n  - name: a\n    replica: 2", "deployments[0] has unknown key 'replica'"),
        ("deployments:\n  - name: a\n    replicas: -1", "(a) 'replicas' has value -1"),
        ("deployments:\n  - name: a\n    engine: sglang", "deployments[0] (a): "),
        (
            "deployments:\n  - name: a\n    engine: mocker\n    engine_args: {speed: 2}",
            "engine argument 'speed' is not known to out=mocker",
        ),
        ("deployments: [", "is not valid YAML"),
    ],
)
def test_mistakes_name_the_deployment_key_and_value(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=None) as caught:
        read_deploy_file(str(path))
    assert message in str(caught.value)
