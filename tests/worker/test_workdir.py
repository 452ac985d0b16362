"""handlerkit.worker.workdir: into the model dir for a call, back to the caller's directory after it."""

from __future__ import annotations

import os

import pytest

from handlerkit.errors import HandlerkitWarning
from handlerkit.worker.workdir import Directories


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    home, caller, elsewhere = (tmp_path / name for name in ("model", "notebook", "elsewhere"))
    for d in (home, caller, elsewhere):
        d.mkdir()
    monkeypatch.chdir(caller)
    return str(home), str(caller), str(elsewhere)


def test_a_call_runs_in_the_model_dir_and_returns(dirs):
    home, caller, _ = dirs
    moves = Directories(home)
    moves.enter()
    assert os.getcwd() == home
    moves.enter()  # nested: only the outermost block moves
    moves.leave("inner")
    assert os.getcwd() == home
    moves.leave("outer")
    assert os.getcwd() == caller


def test_the_caller_moving_between_calls_is_followed(dirs, tmp_path):
    home, caller, elsewhere = dirs
    moves = Directories(home)
    moves.enter()
    moves.leave("call")
    os.chdir(elsewhere)
    moves.enter()
    assert os.getcwd() == home
    moves.leave("call")
    assert os.getcwd() == elsewhere and moves.previous == elsewhere


def test_a_handler_that_moves_is_reported_once_and_put_back(dirs):
    home, caller, elsewhere = dirs
    moves = Directories(home)
    for _ in range(2):
        moves.enter()
        os.chdir(elsewhere)
        if not moves.warned:
            with pytest.warns(HandlerkitWarning, match=r"preprocess changed the working directory to .*elsewhere"):
                moves.leave("preprocess")
        else:
            moves.leave("preprocess")  # the same directory: said once
        assert os.getcwd() == caller
    assert moves.warned == {elsewhere}


def test_a_removed_directory_is_named_and_left(dirs, tmp_path):
    home, caller, _ = dirs
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    moves = Directories(home)
    moves.enter()
    os.chdir(doomed)
    doomed.rmdir()
    with pytest.warns(HandlerkitWarning, match=r"to \(a removed directory\)"):
        moves.leave("handle")
    assert os.getcwd() == caller


def test_closing_releases_both_directories(dirs):
    home, _, _ = dirs
    before = set(os.listdir("/proc/self/fd"))
    moves = Directories(home)
    moves.enter()
    moves.leave("call")
    assert len(set(os.listdir("/proc/self/fd")) - before) == 2
    moves.close()
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_without_fchdir_paths_are_used(dirs, monkeypatch):
    home, caller, _ = dirs
    monkeypatch.delattr(os, "fchdir")
    moves = Directories(home)
    assert moves.fds == [None, None]
    moves.enter()
    assert os.getcwd() == home
    moves.leave("call")
    assert os.getcwd() == caller
