"""Token shards: the tool's round trip, the windows TokenDataset reads, damaged shards refused."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from trainer_helpers import REPO

from fsdpkit import resilience
from fsdpkit.data.make_shards import EOS, decode
from fsdpkit.resilience.dataset.format import TokenShards, read_header
from fsdpkit.trainer.config import ConfigError, load_config


def _make(tmp: Path, texts: list[str], *extra: str) -> tuple[Path, subprocess.CompletedProcess]:
    files = []
    for i, text in enumerate(texts):
        f = tmp / f"doc{i}.txt"
        f.write_text(text, encoding="utf-8")
        files.append(str(f))
    out = tmp / "shards"
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.data.make_shards", *files, "--out", str(out), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return out, proc


def test_round_trip_across_shards(tmp_path: Path) -> None:
    texts = ["héllo wörld\n" * 20, "second document, ascii only", "ünïcode ✓ " * 30]
    out, proc = _make(tmp_path, texts, "--shard-tokens", "100")
    assert proc.returncode == 0, proc.stderr
    files = sorted(out.glob("*.bin"))
    assert len(files) > 3 and all(read_header(f).num_tokens <= 100 for f in files)
    stream = TokenShards(out).read(0, TokenShards(out).num_tokens)
    assert [d.decode("utf-8") for d in decode(stream)] == texts
    assert int((stream == EOS).sum()) == len(texts)


def test_loader_reads_windows_of_the_stream_in_a_seeded_order(tmp_path: Path) -> None:
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(500))  # no repeated 16-grams
    out, proc = _make(tmp_path, [text], "--shard-tokens", "64")
    assert proc.returncode == 0, proc.stderr
    stream = TokenShards(out).read(0, TokenShards(out).num_tokens)
    cfg = resilience.load_config(["--run.id", "x", "--checkpoint.mode", "off"])
    plan = resilience.plan_batch(cfg, micro_batch=2, world_size=2)

    def dataset(rank: int) -> resilience.TokenDataset:
        return resilience.TokenDataset(out, seq_len=15, plan=plan, rank=rank, seed=3, vocab_size=2048)

    loaders = [dataset(r) for r in range(2)]
    windows = stream.size // 16
    seen = set()
    for _ in range(windows // 4):
        for loader in loaders:
            x, y = loader.next_batch()
            assert x.shape == (2, 15) and np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
            for row in np.concatenate([x.numpy(), y[:, -1:].numpy()], axis=1):
                start = next(i for i in range(0, windows * 16, 16) if np.array_equal(stream[i : i + 16], row))
                seen.add(start)
    assert len(seen) == (windows // 4) * 4, "every window of an epoch is distinct"
    replay = dataset(1)
    replay.load_state_dict({"samples_consumed": 4})
    again = dataset(1)
    again.next_batch()
    assert np.array_equal(replay.next_batch()[0].numpy(), again.next_batch()[0].numpy())


def test_truncated_shard_is_a_one_line_config_error(tmp_path: Path) -> None:
    out, proc = _make(tmp_path, ["x" * 500])
    assert proc.returncode == 0, proc.stderr
    shard = next(out.glob("*.bin"))
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(ConfigError, match=r"truncated or damaged; rebuild it with make_shards"):
        load_config(
            ["--run.id", "x", "--data.kind", "shards", "--data.path", str(out), "--data.seq_len", "32"]
        )


def test_tool_rejects_missing_input(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.data.make_shards", str(tmp_path / "absent.txt"),
         "--out", str(tmp_path / "o")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 78 and proc.stderr.startswith("error: input file(s) not found")
