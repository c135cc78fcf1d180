"""moert.cluster.actors: how moert calls ray.init for a parsed --ray (no cluster started: a recording stand-in)."""

from __future__ import annotations

import logging

import pytest

from moert import cluster
from moert.devices.remote import RemoteDeviceError


class Recorder:
    def __init__(self, fail: Exception | None = None):
        self.calls, self.fail = [], fail

    def init(self, **kw):
        self.calls.append(kw)
        if self.fail:
            raise self.fail


def test_a_local_cluster_keeps_rays_notices_quiet_and_a_joined_one_shows_its_warnings(monkeypatch):
    monkeypatch.delenv("MOERT_RAY_LOG", raising=False)
    ray = Recorder()
    cluster.start(ray, *cluster.parse_address("local:2"), "local:2")
    cluster.start(ray, *cluster.parse_address("10.0.0.5:6379"), "10.0.0.5:6379")
    local, joined = ray.calls
    assert local["logging_level"] == logging.ERROR and "address" not in local and not local["include_dashboard"]
    assert joined["logging_level"] == logging.WARNING and joined["address"] == "10.0.0.5:6379"
    monkeypatch.setenv("MOERT_RAY_LOG", "info")
    cluster.start(ray, *cluster.parse_address("local:1"), "local:1")
    assert ray.calls[-1]["logging_level"] == logging.INFO


def test_a_cluster_that_cannot_be_joined_is_a_typed_error_naming_the_address():
    with pytest.raises(RemoteDeviceError, match=r"10\.0\.0\.5:6379.*could not join.*ray start"):
        cluster.start(Recorder(ConnectionError("refused")), *cluster.parse_address("10.0.0.5:6379"), "10.0.0.5:6379")
