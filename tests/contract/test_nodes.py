"""``nodes``: one job on several machines. Its bounds, hostile values, the rules it shares
with ``devices`` (the world is nodes x devices), the service's own maximum, and the
worker settings a multi-node job needs (address, rendezvous ports, the placement wait)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from amptrain.contract.admission import ServicePolicy, admission_problems
from amptrain.contract.limits import spec_limits
from amptrain.contract.spec import MAX_NODES, parse_spec
from amptrain.core.nodes import node_address
from amptrain.core.settings import Settings
from tests.contract.test_devices import BASE, refusal


def test_nodes_share_the_global_batch_with_devices() -> None:
    spec = parse_spec({**BASE, "batch_size": 96, "grad_accum_steps": 2, "devices": 2, "nodes": 3})
    assert (spec.world_size, spec.micro_batch_size) == (6, 8)  # 96 = 8 x 2 x 2 devices x 3
    assert parse_spec(BASE).nodes == 1
    message = refusal(batch_size=64, devices=1, nodes=3)
    assert "divisible by nodes x devices x grad_accum_steps (3 x 1 x 1 = 3)" in message


@pytest.mark.parametrize("value", [0, MAX_NODES + 1, "2", 1e9, 2.0, True, None, [2], -1])
def test_hostile_nodes_are_refused_naming_the_field(value: Any) -> None:
    message = refusal(nodes=value)
    assert "nodes" in message
    assert spec_limits()["nodes"] == {"minimum": 1, "maximum": MAX_NODES}


@pytest.mark.parametrize(
    "field",
    ["rdzv_endpoint", "rendezvous", "master_addr", "master_port", "rdzv_id", "node_address"],
)
def test_a_spec_cannot_set_the_rendezvous(field: str) -> None:
    # The service alone picks where the nodes meet: a spec naming a host would make the
    # workers connect wherever its author likes.
    message = refusal(nodes=2, **{field: "10.0.0.1:29400"})
    assert field in message and "Extra inputs are not permitted" in message


def test_one_process_rules_count_nodes_too() -> None:
    assert "auto_micro_batch needs devices 1 and nodes 1 (got devices 1, nodes 2)" in refusal(
        nodes=2, auto_micro_batch=True
    )
    spike = {"spike": {"action": "warn"}}
    assert "health.spike needs devices 1 and nodes 1" in refusal(nodes=2, health=spike)


def test_the_service_maximum_is_a_problem_naming_nodes() -> None:
    spec = parse_spec({**BASE, "nodes": 3, "batch_size": 48})
    (problem,) = admission_problems(spec, "alice", ServicePolicy(max_nodes=2))
    assert (
        problem["loc"] == ["nodes"] and "at most 2 nodes on this service; got 3" in problem["msg"]
    )
    assert admission_problems(spec, "alice", ServicePolicy(max_nodes=3)) == []


def test_worker_settings_are_bounded_and_name_the_setting() -> None:
    s = Settings(rdzv_ports="30000-30009", node_address="10.1.2.3", node_wait_seconds=5)
    assert (s.rdzv_ports, node_address(s.node_address)) == ((30000, 30009), "10.1.2.3")
    assert Settings(node_address="worker-1.amptrain.svc").node_address.startswith("worker")
    assert node_address(Settings().node_address)  # detected: an address, never empty
    for bad, named in [
        ({"rdzv_ports": "80-90"}, "AMPTRAIN_RDZV_PORTS"),
        ({"rdzv_ports": "30010-30000"}, "AMPTRAIN_RDZV_PORTS"),
        ({"rdzv_ports": "1024-65535"}, "AMPTRAIN_RDZV_PORTS"),
        ({"rdzv_ports": "29400"}, "AMPTRAIN_RDZV_PORTS"),
        ({"node_address": "10.0.0.1; rm -rf /"}, "AMPTRAIN_NODE_ADDRESS"),
        ({"node_address": "a" * 300}, "AMPTRAIN_NODE_ADDRESS"),
        ({"node_wait_seconds": 0}, "node_wait_seconds"),
        ({"node_wait_seconds": 1e9}, "node_wait_seconds"),
        ({"max_nodes": 0}, "max_nodes"),
        ({"max_nodes": MAX_NODES + 1}, "max_nodes"),
    ]:
        with pytest.raises(ValidationError) as info:
            Settings(**bad)
        assert named in str(info.value), bad
