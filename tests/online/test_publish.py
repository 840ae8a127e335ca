"""The follow trainer's hand-back: an endpoint serving its last inflight version gets it again as the
snapshot at its path; nothing for an endpoint that takes snapshots (`--inflight off`); a failure
becomes a note."""

from __future__ import annotations

from tinkertrace.online.publish import hand_back, holder_publisher
from tinkertrace.serving.policy import PolicyHolder

RECORD = {"sampler_path": "tinker://r/sampler_weights/000001", "policy_version": 1}


def test_the_last_inflight_version_comes_back_as_its_snapshot() -> None:
    holder = PolicyHolder("hosted", None, "m", loader=lambda path: f"snapshot:{path}")
    publish = holder_publisher(holder)
    publish.publish(RECORD, "inflight-1")
    assert holder.current().inflight and holder.current().sampling_client == "inflight-1"
    assert hand_back(publish, RECORD) is None
    served = holder.current()
    assert (served.sampling_client, served.version, served.inflight) == (
        f"snapshot:{RECORD['sampler_path']}",
        1,
        False,
    )


def test_nothing_is_handed_back_to_an_endpoint_of_snapshots_and_a_failure_is_a_note() -> None:
    loaded: list[str] = []
    off = PolicyHolder("hosted", None, "m", loader=lambda path: loaded.append(path), inflight="off")
    assert hand_back(holder_publisher(off), RECORD) is None and loaded == []

    def gone(path: str) -> object:
        raise OSError("the service is gone")

    hosted = PolicyHolder("hosted", None, "m", loader=gone)
    holder_publisher(hosted).publish(RECORD, "inflight-1")
    note = hand_back(holder_publisher(hosted), RECORD)
    assert note == "could not hand version 1 back to the endpoint as a snapshot: the service is gone"
    assert hosted.current().sampling_client == "inflight-1"
