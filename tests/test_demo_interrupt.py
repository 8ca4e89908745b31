"""`make run` interrupted (Ctrl-C): one line saying so and exit code 130, not a 20-frame KeyboardInterrupt
traceback (the protocol's own cleanup stops its servers on the way out: clients/runner.served). From a review
helper; fails on the old code (the interrupt propagated)."""
from __future__ import annotations


def test_an_interrupted_demo_says_so_in_one_line(monkeypatch, capsys):
    import clients.matched_hbm as matched_hbm
    from trtllm_dasc import demo

    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(matched_hbm, "main", interrupted)
    assert demo.main() == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and "Traceback" not in err[0]
