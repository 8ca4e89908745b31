"""clients/cells_estimate.py: the device time left, against a schedule worked out by hand."""
from clients.cells_estimate import estimate


def test_the_time_left_is_the_pending_requests_at_each_arms_measured_rate():
    manifest = {"baseline": "dense", "arms": [{"key": "dense"}, {"key": "a"}, {"key": "b"}],
                "phases": [{"q": 10, "repeats": 2}, {"q": 5, "repeats": 1}],
                "units": ["p0-b0-s1", "p1-b0-s1"]}
    # p0: 2 x 10 x 2 = 40 requests a cell, p1: 10. dense 10 s a request, a 5, b unmeasured: their mean 7.5
    cells = [{"arm": "dense", "unit": "p0-b0-s1", "seconds": 400.0},
             {"arm": "a", "unit": "p0-b0-s1", "seconds": 200.0}]
    done = {("dense", "p0-b0-s1"), ("a", "p0-b0-s1")}
    got = estimate(manifest, cells, lambda k, u: (k, u) in done, prior=1.0)
    assert got["rate_s_per_request"] == {"dense": 10.0, "a": 5.0, "b": 7.5}
    assert got["rates_measured"] == ["a", "dense"]
    # shared: p0 dense 400 + b 300; p1 dense 100 + a 50 + b 75  -> 925
    # arm by arm: p0 (400 + 300); p1 (100 + 50) + (100 + 75)   -> 1025
    assert got["shared_s"] == 925 and got["arm_by_arm_s"] == 1025
    assert got["per_arm_s"] == {"b": 375, "a": 50}


def test_nothing_measured_takes_the_prior():
    manifest = {"baseline": "dense", "arms": [{"key": "dense"}, {"key": "a"}],
                "phases": [{"q": 50, "repeats": 1}], "units": ["p0-b0-s1"]}
    got = estimate(manifest, [], lambda k, u: False, prior=0.5)
    # 100 requests: dense 50 s + a 50 s in either schedule
    assert got["shared_s"] == 100 and got["arm_by_arm_s"] == 100 and got["rates_measured"] == []
