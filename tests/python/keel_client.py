#!/usr/bin/env python3
"""A third-party client of keeld: Python's grpcio (Debian's python3-grpcio) with
stubs generated from proto/keel.proto. Submits a sweep, lists its runs and
checks that a wrong token is refused. Exits 0 when every check passed.

usage: keel_client.py STUB_DIR ADDRESS TOKEN
"""
import sys

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
from proto import keel_pb2, keel_pb2_grpc  # noqa: E402
from tests.python.grpc_std import health_pb2, health_pb2_grpc  # noqa: E402
from tests.python.grpc_std import reflection_pb2, reflection_pb2_grpc  # noqa: E402

SWEEP = """name: from-python
base:
  model: {type: proxy, layers: 1, width: 16}
  batch: 32
  steps: 5
axes:
  - grid: {seed: [1, 2, 3]}
"""


def main():
    address, token = sys.argv[2], sys.argv[3]
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=20)
    stub = keel_pb2_grpc.KeelServiceStub(channel)
    auth = [("authorization", "Bearer " + token)]

    submitted = stub.SubmitSweep(
        keel_pb2.SubmitSweepRequest(spec=keel_pb2.SweepSpec(yaml=SWEEP, source="python.yaml")),
        metadata=auth, timeout=10)
    assert len(submitted.runs) == 3, submitted
    runs = stub.ListRuns(keel_pb2.ListRunsRequest(sweep_id=submitted.sweep.id), metadata=auth, timeout=10)
    assert [r.id for r in runs.runs] == [r.id for r in submitted.runs], runs
    assert all(r.state == keel_pb2.QUEUED for r in runs.runs), runs
    assert sorted(r.axes["seed"] for r in runs.runs) == ["1", "2", "3"], runs

    try:
        stub.ListSweeps(keel_pb2.ListSweepsRequest(), metadata=[("authorization", "Bearer nope-0123456789abcdef")],
                        timeout=10)
        raise AssertionError("a wrong token was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e

    try:
        stub.SubmitSweep(keel_pb2.SubmitSweepRequest(spec=keel_pb2.SweepSpec(yaml="name: x\nbase: {batch: -1}\n")),
                         metadata=auth, timeout=10)
        raise AssertionError("a negative batch was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "batch" in e.details(), e.details()
    # Standard gRPC tooling works: health checking and server reflection.
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING, health
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                   timeout=10))
    services = [s.name for s in answers[0].list_services_response.service]
    assert "keel.v1.KeelService" in services and "keel.v1.WorkerService" in services, services

    print("python client: submitted %s with %d runs, listed them, refusals ok, health SERVING, reflection lists %s"
          % (submitted.sweep.id, len(runs.runs), ", ".join(sorted(services))))


if __name__ == "__main__":
    main()
