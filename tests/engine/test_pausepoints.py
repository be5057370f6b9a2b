"""The engine's crash-window pause points are inert unless the settings switch them on.

``LEASES_TEST_PAUSE`` alone (an environment variable any production process might inherit)
must never block the engine: only ``LEASES_TEST_PAUSE_POINTS = True`` (set by
``config.settings_test``, which is not in the wheel) arms them.
"""

from __future__ import annotations

import threading

import pytest

from leases.engine import pausepoints


def _returns_within(seconds: float, fn) -> bool:
    done = threading.Event()

    def run():
        fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()  # a paused one sleeps forever: daemon
    return done.wait(seconds)


def test_given_the_pause_variable_but_pause_points_off_when_the_engine_passes_one_then_it_does_not_block(
        settings, monkeypatch):
    settings.LEASES_TEST_PAUSE_POINTS = False
    monkeypatch.setenv(pausepoints.PAUSE_ENV, "acquire")
    assert _returns_within(2.0, lambda: pausepoints.pause_point("acquire")), "blocked although pause points are off"


def test_given_the_default_settings_then_pause_points_are_off(settings):
    del settings.LEASES_TEST_PAUSE_POINTS
    assert pausepoints.armed() is False


@pytest.mark.parametrize("named", ["release", ""])
def test_given_pause_points_on_when_the_variable_names_another_point_then_it_does_not_block(
        settings, monkeypatch, named):
    settings.LEASES_TEST_PAUSE_POINTS = True
    monkeypatch.setenv(pausepoints.PAUSE_ENV, named)
    assert _returns_within(2.0, lambda: pausepoints.pause_point("acquire"))


def test_given_pause_points_on_when_the_variable_names_the_point_then_it_blocks(settings, monkeypatch, capfd):
    settings.LEASES_TEST_PAUSE_POINTS = True
    monkeypatch.setenv(pausepoints.PAUSE_ENV, "acquire")
    assert not _returns_within(0.5, lambda: pausepoints.pause_point("acquire"))
    assert "LEASES-PAUSED acquire" in capfd.readouterr().err
