"""The real CLIs as subprocesses: bad input gives one line on stderr, a non-zero exit and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ops_world import PREFIX, World

from fsdpkit.contracts.cliargs import OneLineParser
from fsdpkit.ops.cli import parse_once
from fsdpkit.ops.cost_report import main as cost_main
from fsdpkit.ops.teardown.__main__ import main as teardown_main


def cli(module: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line_error(p: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("module", ["fsdpkit.ops.teardown", "fsdpkit.ops.cost_report"])
def test_unknown_region(module: str, fake_aws, subprocess_env: dict[str, str]) -> None:
    p = cli(module, subprocess_env, "--prefix", PREFIX, "--region", "us-nowhere-1")
    assert_one_line_error(p, 2, "unknown AWS region 'us-nowhere-1'", "us-east-1")


@pytest.mark.parametrize("module", ["fsdpkit.ops.teardown", "fsdpkit.ops.cost_report"])
def test_no_credentials(module: str, fake_aws, subprocess_env: dict[str, str]) -> None:
    env = {k: v for k, v in subprocess_env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    p = cli(module, env, "--prefix", PREFIX)
    assert_one_line_error(p, 2, "no AWS credentials", "AWS_PROFILE")


def test_prefix_that_matches_nothing(world: World, subprocess_env: dict[str, str]) -> None:
    world.stacks()
    p = cli("fsdpkit.ops.teardown", subprocess_env, "--prefix", "Nope")
    assert_one_line_error(p, 5, "nothing tagged kit:project=Nope", "--prefix")


def test_bad_prefix_is_rejected(fake_aws, subprocess_env: dict[str, str]) -> None:
    p = cli("fsdpkit.ops.teardown", subprocess_env, "--prefix", "9 lives")
    assert_one_line_error(p, 2, "--prefix must be")


def test_dry_run_prints_the_plan_and_how_to_confirm(world: World, subprocess_env: dict[str, str]) -> None:
    world.full()
    before = world.inventory()
    p = cli("fsdpkit.ops.teardown", subprocess_env, "--prefix", PREFIX)
    assert p.returncode == 0, p.stderr
    assert "Teardown plan" in p.stdout and "delete" in p.stdout and "keep" in p.stdout
    assert f"--confirm '{PREFIX}/123456789012'" in p.stderr
    assert world.inventory() == before


def test_subprocess_run_retries_throttling_with_real_backoff(
    world: World, fake_aws, subprocess_env: dict[str, str]
) -> None:
    world.full()
    rule = fake_aws.proxy.fail("ecr", "DeleteRepository", "ThrottlingException", times=2)
    p = cli(
        "fsdpkit.ops.teardown",
        subprocess_env,
        "--prefix",
        PREFIX,
        "--only",
        "ecr",
        "--yes",
        "--confirm",
        f"{PREFIX}/123456789012",
        "--retry-mode",
        "standard",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert rule.hits == 2
    assert "deleted 1, kept 0, failed 0" in p.stdout
    assert "kit1/trainer" not in world.inventory()["ecr"]


BAD_TEARDOWN_FLAGS = [
    (["--backoff", "nan"], "argument --backoff: 'nan': must be a finite number"),
    (["--timeout", "nan"], "argument --timeout: 'nan': must be a finite number"),
    (["--timeout", "inf"], "argument --timeout: 'inf': must be a finite number"),
    (["--timeout", "0"], "argument --timeout: '0': must be greater than 0"),
    (["--timeout", "1e9"], "argument --timeout: '1e9': must be at most 86400"),
    (["--poll-interval", "-1"], "argument --poll-interval: '-1': must be greater than 0"),
    (["--poll-interval", "abc"], "argument --poll-interval: 'abc': not a number"),
    (["--backoff", "7200"], "argument --backoff: '7200': must be at most 3600"),
    (["--max-attempts", "1.5"], "argument --max-attempts: '1.5': not a whole number"),
    (["--max-attempts", "0"], "argument --max-attempts: '0': must be at least 1"),
    (["--max-attempts", "51"], "argument --max-attempts: '51': must be at most 50"),
    (["--only", "vpc"], "argument --only: invalid choice: 'vpc'"),
    (["--retry-mode", "fast"], "argument --retry-mode: invalid choice: 'fast'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--region", "us-east-1", "--region", "eu-west-1"], "argument --region: given more than once"),
    (["--timeout=5", "--timeout", "6"], "argument --timeout: given more than once"),
    (["--fsx-backup", "--no-fsx-backup"], "argument --fsx-backup: given more than once"),
    # abbreviations are refused: `--reg a --region b` must not parse (last wins) past the count
    (["--reg", "us-east-1", "--region", "eu-west-1"], "unrecognized arguments: --reg us-east-1"),
    (["--time", "5", "--timeout", "6"], "unrecognized arguments: --time 5"),
    (["--reg=eu-west-1"], "unrecognized arguments: --reg=eu-west-1"),
    (["--no-fsx", "--fsx-backup"], "unrecognized arguments: --no-fsx"),
]
BAD_COST_FLAGS = [
    (["--gpu-hour-price", "nan"], "argument --gpu-hour-price: 'nan': must be a finite number"),
    (["--gpu-hour-price=-inf"], "argument --gpu-hour-price: '-inf': must be a finite number"),
    (["--gpu-hour-price", "0"], "argument --gpu-hour-price: '0': must be greater than 0"),
    (["--gpu-hour-price", "1e6"], "argument --gpu-hour-price: '1e6': must be at most 1000"),
    (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["--format", "md", "--format", "json"], "argument --format: given more than once"),
    (["--form", "md", "--format", "json"], "unrecognized arguments: --form md"),
    (["--gpu-hour", "2"], "unrecognized arguments: --gpu-hour 2"),
]


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [("teardown", a, m) for a, m in BAD_TEARDOWN_FLAGS] + [("cost_report", a, m) for a, m in BAD_COST_FLAGS],
)
def test_bad_flags_are_one_line_before_any_aws_call(
    module: str, args: list[str], message: str, fake_aws, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--backoff nan` would crash mid-deletion and `--timeout nan` would hang: both stop here, at parsing."""
    main = {"teardown": teardown_main, "cost_report": cost_main}[module]
    extra = ["--yes", "--confirm", f"{PREFIX}/123456789012"] if module == "teardown" else []
    with pytest.raises(SystemExit) as exc:
        main(["--prefix", PREFIX, *extra, *args])
    assert exc.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"python -m fsdpkit.ops.{module}: error: ") and message in lines[0], lines[0]
    assert fake_aws.proxy.log == []  # nothing was asked of AWS, let alone deleted


@pytest.mark.parametrize("module", ["fsdpkit.ops.teardown", "fsdpkit.ops.cost_report"])
def test_a_missing_prefix_is_one_line_not_a_usage_block(module: str, subprocess_env: dict[str, str]) -> None:
    p = cli(module, subprocess_env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [
        f"python -m {module}: error: the following arguments are required: --prefix"
    ]


def test_aws_region_alone_is_enough(world: World, subprocess_env: dict[str, str]) -> None:
    """boto3's session reads AWS_DEFAULT_REGION only; the CLIs also honour AWS_REGION, as the docs say."""
    world.stacks()
    env = {k: v for k, v in subprocess_env.items() if k != "AWS_DEFAULT_REGION"}
    p = cli("fsdpkit.ops.teardown", env, "--prefix", "Nope")
    assert_one_line_error(p, 5, "nothing tagged kit:project=Nope in us-east-1")


def test_parse_once_refuses_a_parser_that_takes_abbreviations() -> None:
    """A parser with abbreviations would let `--reg a --region b` through the count: refused at build time."""
    p = OneLineParser(prog="x")
    p.add_argument("--region")
    with pytest.raises(ValueError, match="allow_abbrev=False"):
        parse_once(p, ["--region", "a"])
