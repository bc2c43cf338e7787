"""goep.ep.backends() and backend_supports: what each backend declares, as
the library reports it, checked against goep_ep.h's goepEpFeature_t and the
CPU engine's declarations (every feature: Go's ep.Supports(ep.CPU, f) is
true for each, checked by capi's TestBackendSupportsCPU)."""

import os
import re

import pytest

import goep.ep as nccl_ep

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "capi", "goep_ep.h")


def test_feature_enum_matches_the_header():
    with open(HEADER) as f:
        enum = {m[0]: int(m[1]) for m in re.findall(r"\bGOEP_EP_FEATURE_(\w+)\s*=\s*(\d+)", f.read())}
    assert enum == {f.name: int(f) for f in nccl_ep.Feature}


def test_cpu_declares_every_feature():
    by_name = {b.name: b for b in nccl_ep.backends()}
    assert "cpu" in by_name and "cpu-onesided" in by_name, sorted(by_name)
    assert by_name["cpu"].features == tuple(f.name for f in nccl_ep.Feature)
    for f in nccl_ep.Feature:
        assert nccl_ep.backend_supports("cpu", f) is True, f


def test_backends_agree_with_backend_supports():
    for b in nccl_ep.backends():
        assert b.features == tuple(f.name for f in nccl_ep.Feature if nccl_ep.backend_supports(b.name, f)), b


def test_unknown_backend_and_feature_refused():
    with pytest.raises(nccl_ep.NcclInvalid, match='"no-such-backend" is not registered'):
        nccl_ep.backend_supports("no-such-backend", nccl_ep.Feature.FP8_WIRE)
    with pytest.raises(nccl_ep.NcclInvalid, match="feature = 99"):
        nccl_ep.backend_supports("cpu", 99)
