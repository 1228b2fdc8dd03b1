"""kubetune.ranks: the one reader of the launcher's RANK / LOCAL_RANK / WORLD_SIZE."""

from __future__ import annotations

import pytest

from kubetune import ranks


def test_a_process_no_launcher_started_is_rank_0_of_one(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert (ranks.rank(), ranks.local_rank(), ranks.world_size()) == (0, 0, 1)
    assert ranks.is_main_process() and not ranks.has_rank()


def test_torchrun_s_variables_are_read(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert (ranks.rank(), ranks.local_rank(), ranks.world_size()) == (5, 1, 8)
    assert not ranks.is_main_process() and ranks.has_rank()


def test_a_malformed_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        ranks.world_size()
