"""fd-2 capture: noise kept back, everything else passed on, all of it on error; shared across threads."""

from __future__ import annotations

import os
import re
import threading

import pytest

from nbdebug.frameworks import native_stderr as ns

NOISE = re.compile(r"GetRealPath")


def test_noise_kept_back_other_lines_passed_on(capfd):
    ns.dropped.clear()
    with ns.native_stderr(NOISE):
        os.write(2, b"[ERROR] CORE GetRealPath failed\nsomething real\n")
        os.write(1, b"stdout untouched\n")
    out, err = capfd.readouterr()
    assert err == "something real\n" and out == "stdout untouched\n"
    assert list(ns.dropped) == ["[ERROR] CORE GetRealPath failed"]
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"  # fd 2 restored


def test_everything_shown_when_the_block_fails(capfd):
    ns.dropped.clear()
    with pytest.raises(ValueError), ns.native_stderr(NOISE):
        os.write(2, b"[ERROR] CORE GetRealPath failed\n")
        raise ValueError("compile failed")
    assert capfd.readouterr().err == "[ERROR] CORE GetRealPath failed\n"
    assert not ns.dropped


def test_nested_and_concurrent_blocks_share_one_capture(capfd):
    ns.dropped.clear()
    started, release = threading.Event(), threading.Event()

    def other():
        with ns.native_stderr(NOISE):
            started.set()
            release.wait(10)
            os.write(2, b"GetRealPath from the other thread\n")

    t = threading.Thread(target=other)
    t.start()
    started.wait(10)
    with ns.native_stderr(NOISE), ns.native_stderr(NOISE):
        os.write(2, b"GetRealPath here\nkept\n")
    release.set()
    t.join(10)
    assert capfd.readouterr().err == "kept\n"
    assert sorted(ns.dropped) == ["GetRealPath from the other thread", "GetRealPath here"]
    assert ns._state["users"] == 0 and ns._state["saved"] is None
