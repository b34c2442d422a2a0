"""The script's command line is the script's: every word after the target reaches it unchanged, whatever it
shares with the launcher's options; the launcher's own options are exact, and a prefix of one is refused in
one line that names it (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpkit.contracts import exitcodes
from fsdpkit.launcher.cli import build_parser, parse_args

REPO = Path(__file__).resolve().parents[2]
OPTIONS = list(build_parser().options)
"""Every option string of the launcher, both spellings (--log-dir and --log_dir), -h and -m included."""


def prefix_words() -> list[str]:
    """For every launcher option: each of its prefixes from `--x` (or `-x`) to the whole option, and the
    whole option with `=value`: the words argparse's abbreviations would take for a launcher option."""
    words: list[str] = []
    for option in OPTIONS:
        start = 3 if option.startswith("--") else 2
        words += [option[:n] for n in range(start, len(option) + 1)]
        words.append(f"{option}=/fsx/x")
    return words


SCRIPT_WORDS = [
    "--log", "/fsx/x", "--max", "3", "--nproc", "2", *prefix_words(),
    "--", "-m", "mod", "--", "a b", "", "-", "-1", "ü", "--help", "-h",
]  # fmt: skip
"""What a script may be given: prefixes of every launcher option, `--` twice, -m, empty and spaced words."""


def test_the_word_list_covers_every_launcher_option() -> None:
    assert {"--log-dir", "--log_dir", "--max-restarts", "--nproc-per-node", "-m", "-h"} <= set(OPTIONS)
    actions = build_parser().options.values()
    assert {a.nargs for a in actions} <= {0, None}, "split_command: a flag takes one value or none"
    assert set(OPTIONS) <= set(SCRIPT_WORDS)  # each option as a whole word too
    assert all(any(w.startswith(o[:3]) and w != o for w in SCRIPT_WORDS) for o in OPTIONS if o[1] == "-")


@pytest.mark.parametrize(
    ("target", "argv_head"),
    [
        (["train.py"], ["-u", "train.py"]),
        (["-m", "my.train"], ["-u", "-m", "my.train"]),
        (["--", "train.py"], ["-u", "train.py"]),  # `--` before the target is the launcher's
        (["--no-python", "./train"], []),
    ],
)
def test_every_word_after_the_target_reaches_it_unchanged(target: list[str], argv_head: list[str]) -> None:
    args = parse_args(["--standalone", "--nproc-per-node=2", "--max-restarts", "1", *target, *SCRIPT_WORDS])
    assert args.argv == [*argv_head, *SCRIPT_WORDS]
    assert (args.nproc_per_node, args.max_restarts) == (2, 1)  # the launcher's own options, exact
    assert args.log_dir is None and args.run_dir is None  # nothing of the script's taken


def test_a_double_dash_right_after_the_script_is_the_scripts() -> None:
    """argparse's positional before REMAINDER would swallow it (`train.py -- a` would run `train.py a`)."""
    assert parse_args(["train.py", "--", "a", "--", "b"]).argv == ["-u", "train.py", "--", "a", "--", "b"]
    assert parse_args(["-m", "t", "--"]).argv == ["-u", "-m", "t", "--"]


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.startswith("--")])
def test_a_launcher_option_shortened_is_refused_naming_it(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = option[:-1]
    assert prefix not in OPTIONS
    with pytest.raises(SystemExit) as exit_:
        parse_args([prefix, "2", "train.py"])
    assert exit_.value.code == exitcodes.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"kit-launch: error: {prefix} is not a launcher option (options are exact")
    assert f"did you mean {option}?" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "2", "train.py"], "--nproc is not a launcher option (options are exact, never "
         "abbreviated): did you mean --nproc-per-node? (see --help)"),
        (["--log=/fsx/x", "train.py"], "--log is not a launcher option (options are exact, never "
         "abbreviated): did you mean --log-dir? (see --help)"),
        (["--heartbeat", "2", "train.py"], "did you mean one of --heartbeat-timeout, "
         "--heartbeat-load-timeout, --heartbeat-safety-factor, --heartbeat-min-timeout?"),
        (["--lr", "1", "train.py"], "--lr is not a launcher option; the script's own options go after it"),
    ],
)  # fmt: skip
def test_a_prefix_is_refused_in_one_line_exit_2(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", *argv],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == exitcodes.USAGE
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


ECHO = """import json, os, sys
with open(os.environ["KIT_TEST_ARGV_OUT"] + "." + os.environ["RANK"], "w", encoding="ascii") as out:
    json.dump([os.fsencode(word).hex() for word in sys.argv[1:]], out)
"""
"""A script that writes its argv, as bytes (hex), into a file per rank."""


@pytest.mark.slow
@pytest.mark.parametrize("start", ["zygote", "exec"])
def test_a_real_script_gets_its_argv_byte_for_byte(tmp_path: Path, start: str) -> None:
    """Through the launcher, its warm workers (the zygote's shim) or a fresh python: prefixes of every
    launcher option, `--`, -m, an empty word, and a byte that is not UTF-8."""
    script = tmp_path / "echo.py"
    script.write_text(ECHO, encoding="utf-8")
    words = [*SCRIPT_WORDS, os.fsdecode(b"\xff-not-utf8")]
    out = tmp_path / "argv"
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path), KIT_TEST_ARGV_OUT=str(out))
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
         f"--worker-start={start}", str(script), *words],
        cwd=REPO, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.{rank}").read_text(encoding="ascii"))
        assert seen == [os.fsencode(word).hex() for word in words]
