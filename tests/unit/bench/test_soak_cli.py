"""`python -m bench soak` reaches the soak's own command line, with its options."""

from __future__ import annotations

import pytest

from bench.__main__ import main


def test_bench_soak_takes_the_soaks_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["soak", "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "python -m bench soak" in shown
    for option in ("--minutes", "--out", "--mix", "--collection-size", "--data", "--short"):
        assert option in shown


def test_a_mix_naming_an_unknown_family_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["soak", "--mix", "pictures=10"])
    assert exited.value.code == 2
    assert "--mix" in capsys.readouterr().err
