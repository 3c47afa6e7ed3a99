"""The lab's rules factor (proto/lab/config.py, docs/lab.md "Profiles"): presets and parametric points, each
turned into server flags that ``responses-lab serve`` takes, and recorded in a run's results."""

from __future__ import annotations

import argparse

import pytest

from proto.lab.config import PROFILES, BenchConfig, profile_named
from proto.lab.report.results import profiles_json
from proto.server.config import add_arguments, from_args


def settings_of(flags: list[str]) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(flags), environ={})


def test_a_parametric_point_becomes_the_servers_rules() -> None:
    point = profile_named("hops:35/3/1.5:beside:user")
    assert (point.safety_hop_ms, point.resolve_hop_ms, point.store_hop_ms) == (35.0, 3.0, 1.5)
    assert (point.placement, point.classify) == ("beside", "user")
    settings = settings_of(point.flags())
    assert (settings.safety_hop_ms, settings.resolve_hop_ms, settings.store_hop_ms) == (35.0, 3.0, 1.5)  # type: ignore[attr-defined]
    assert (settings.safety_placement, settings.safety_classify) == ("beside", "user")  # type: ignore[attr-defined]
    # Left out: the classifier before the prefill, on all new content.
    assert profile_named("hops:20/2/2").factors()["safety_placement"] == "before"
    assert profile_named("hops:20/2/2").classify == "new"


@pytest.mark.parametrize(
    "name", ["nowhere", "hops:", "hops:20/2", "hops:20/2/2:after", "hops:20/2/2:beside:before", "hops:-1/0/0"]
)
def test_a_bad_profile_is_refused_with_what_is_wrong(name: str) -> None:
    with pytest.raises(ValueError, match="profile"):
        profile_named(name)


def test_every_run_records_the_rules_of_its_profiles() -> None:
    config = BenchConfig()
    assert config.profiles[0] == "local"  # measured work only: the primary result
    assert {PROFILES[p].placement for p in config.profiles} == {"before", "beside"}
    assert BenchConfig.quick_preset().profiles == ("local", "production-like")
    recorded = profiles_json(config)
    assert recorded["production-like-beside"] == {
        "safety_hop_ms": 20.0,
        "resolve_hop_ms": 2.0,
        "store_hop_ms": 2.0,
        "safety_placement": "beside",
        "safety_classify": "new",
    }


def test_the_timeline_draws_the_classifier_beside_the_prefill_not_before_it() -> None:
    from proto.lab.analysis.metrics import RoundTimes
    from proto.lab.report.timeline import _server

    report = {
        "prefill_ms": 100.0,
        "queue_wait_ms": 0.0,
        "decode_ms": 10.0,
        "phases_ms": {"safety": 1.0, "safety_hop": 300.0, "safety_wait": 200.0},
    }
    spans = {s["name"]: (s["start"], s["end"]) for s in _server(RoundTimes(0.0, 1.0, 1.01, 1.02), report)}
    assert spans["prefill"] == pytest.approx((0.7, 0.8))  # it ended when the first token began to wait
    assert spans["safety_hop"] == pytest.approx((0.7, 1.0))  # from the prefill's start, beside it
    assert spans["safety_wait"] == pytest.approx((0.8, 1.0))
    assert spans["safety"] == pytest.approx((0.699, 0.7))  # the local scan, before both
    serial = dict(report, phases_ms={"safety": 1.0, "safety_hop": 300.0})
    spans = {s["name"]: (s["start"], s["end"]) for s in _server(RoundTimes(0.0, 1.0, 1.01, 1.02), serial)}
    assert spans["prefill"] == pytest.approx((0.9, 1.0)) and spans["safety_hop"] == pytest.approx((0.6, 0.9))
