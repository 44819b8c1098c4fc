"""``measure.call_timer.CallTimer`` on a CPU: one time per call in call order, ``reset`` forgets them, ``remove`` puts
the class's method back, and what the wrapped method returns and raises is unchanged."""

import time

import pytest

from servelab.measure.call_timer import CallTimer


class Step:
    def run(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("negative")
        time.sleep(seconds)
        return seconds


def test_each_call_is_timed_in_order_and_reset_and_remove_undo_it():
    s = Step()
    t = CallTimer(s, "run", "cpu")
    assert [s.run(x) for x in (0.02, 0.0, 0.01)] == [0.02, 0.0, 0.01]
    ms = t.ms()
    assert len(ms) == 3 and ms[0] >= 20 and ms[1] < ms[0] and ms[2] >= 10
    with pytest.raises(ValueError, match="negative"):
        s.run(-1)
    t.reset()
    s.run(0.0)
    assert len(t.ms()) == 1
    t.remove()
    assert "run" not in vars(s) and s.run(0.0) == 0.0 and len(t.ms()) == 1


def test_a_note_keeps_what_each_call_was_asked_beside_its_time():
    s = Step()
    t = CallTimer(s, "run", "cpu", note=lambda seconds: seconds > 0)
    s.run(0.0), s.run(0.001)
    assert t.notes == [False, True] and len(t.ms()) == 2
    t.reset()
    assert t.notes == [] and t.ms() == []
