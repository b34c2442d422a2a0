"""The shared strict parsers: an unknown spelling or a non-finite number is an error naming the value."""

import argparse
import os
from pathlib import Path

import pytest

from fsdpkit.contracts.cliargs import (
    OneLineParser,
    float_arg,
    int_arg,
    output_file_problem,
    output_folder_problem,
    parse_bool,
    parse_float,
    parse_int,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1", True),
        ("YES", True),
        (" on ", True),
        ("0", False),
        ("off", False),
        (None, False),
        (True, True),
    ],
)
def test_parse_bool_known_spellings(text, want):
    assert parse_bool(text, "DRY_RUN") is want


@pytest.mark.parametrize("text", ["y", "n", "2", "yes please", "tru", "", " "])
def test_parse_bool_refuses_unknown_spelling(text):
    with pytest.raises(ValueError, match=rf"^DRY_RUN={text!r}: not a boolean"):
        parse_bool(text, "DRY_RUN")


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("nan", "finite"),
        ("inf", "finite"),
        ("-inf", "finite"),
        ("abc", "not a number"),
        ("-1", "at least 0"),
        ("11", "at most 10"),
    ],
)
def test_parse_float_refuses(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_float(text, "TIMEOUT", lo=0, hi=10)


def test_parse_float_open_bound():
    assert parse_float("0.5", "x", lo=0, lo_open=True) == 0.5
    with pytest.raises(ValueError, match="greater than 0"):
        parse_float("0", "x", lo=0, lo_open=True)


@pytest.mark.parametrize("text", ["1.5", "1e3", "nan", "", "four", "1_000", "\u0664", "0x10"])
def test_parse_int_refuses_non_integers(text):
    with pytest.raises(ValueError, match="not a whole number"):
        parse_int(text, "NODES", lo=1)


def test_argparse_types_give_one_error_line(capsys):
    p = OneLineParser(prog="tool")
    p.add_argument("--backoff", type=float_arg(lo=0, hi=60))
    p.add_argument("--n", type=int_arg(lo=1))
    assert p.parse_args(["--backoff", "2.5", "--n", "3"]) == argparse.Namespace(backoff=2.5, n=3)
    for argv, msg in (
        (["--backoff", "nan"], "'nan': must be a finite number"),
        (["--n", "0"], "must be at least 1"),
    ):
        with pytest.raises(SystemExit) as exc:
            p.parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("tool: error: ") and msg in err


@pytest.mark.parametrize("text", ["1_0.5", "\u0664.5", "0x1p3", "1e", ".", "--1"])
def test_parse_float_takes_ascii_numbers_only(text):
    with pytest.raises(ValueError, match="not a number"):
        parse_float(text, "X")


@pytest.mark.parametrize(
    ("text", "want"), [("1e-3", 1e-3), (" 2.5 ", 2.5), ("-.5", -0.5), (3, 3.0), (0.25, 0.25)]
)
def test_parse_float_accepts_plain_numbers(text, want):
    assert parse_float(text, "X") == want


@pytest.mark.parametrize("text", ["NaN", "+inf", "-Infinity", float("nan"), float("inf")])
def test_parse_float_names_non_finite_values(text):
    with pytest.raises(ValueError, match="must be a finite number"):
        parse_float(text, "X")


def test_output_paths_that_cannot_be_made_or_written_name_the_argument(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert output_folder_problem(tmp_path / "new" / "deeper", "OUT") is None
    assert not (tmp_path / "new").exists()  # a check, not an act: a dry run creates nothing
    assert output_folder_problem(a_file, "OUT") == (
        f"OUT={str(a_file)!r}: {str(a_file)!r} is a file, not a folder; pick a folder you can write"
    )
    assert f"{str(a_file)!r} is a file, so {str(a_file / 'x')!r} cannot be created" in output_folder_problem(
        a_file / "x", "OUT"
    )
    assert output_file_problem(tmp_path / "new" / "t.png", "--png") is None
    assert output_file_problem(tmp_path, "--png") == f"--png={str(tmp_path)!r}: is a folder; give a file path"
    assert output_file_problem(a_file / "t.png", "--png") == (
        f"--png={str(a_file / 't.png')!r}: {str(a_file)!r} is a file, not a folder; pick a path you can write"
    )
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root writes anywhere: then there is nothing to refuse
        assert "is not writable" in output_folder_problem(locked / "x", "--workdir")
