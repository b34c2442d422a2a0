"""resilience.TokenDataset in one process: the trainer's sample order (pinned), the BatchPlan's split and its
audit, a resharded resume of the cursor, a step's rewind, Megatron-LM's .bin/.idx read back (written here
from Megatron's layout, independently of the reader) and bad input refused in one line each. The same
guarantees on real processes (a restart, then 2 -> 3 ranks) are in test_token_dataset_resume.py."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fsdpkit import resilience
from fsdpkit.resilience.batch import BatchPlan
from fsdpkit.resilience.dataset.format import TokenShards, write_shard
from fsdpkit.resilience.dataset.megatron import SCAN_TOKENS, MegatronTokens

SEQ = 15
VOCAB = 1000


def plan(world: int, *, micro: int = 2, global_batch: int = 12) -> BatchPlan:
    cfg = resilience.load_config(
        ["--run.id", "x", "--checkpoint.mode", "off", "--training.global_batch", str(global_batch)]
    )
    return resilience.plan_batch(cfg, micro_batch=micro, world_size=world)


def stream_tokens(n: int, *, start: int = 0) -> np.ndarray:
    """Token ids that repeat no window: a sample's tokens say where in the stream it came from."""
    return (np.arange(start, start + n) * 7919 + 13) % VOCAB


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Three shards of 1000, 777 and 1500 tokens: 204 windows of 16, some across two shards."""
    folder = tmp_path / "shards"
    folder.mkdir()
    start = 0
    for i, n in enumerate((1000, 777, 1500)):
        write_shard(folder / f"shard_{i:05d}.bin", stream_tokens(n, start=start), vocab_size=VOCAB)
        start += n
    return folder


def dataset(path: Path | str, world: int = 1, rank: int = 0) -> resilience.TokenDataset:
    return resilience.TokenDataset(path, seq_len=SEQ, plan=plan(world), rank=rank, seed=3, vocab_size=VOCAB)


def test_the_sample_order_is_the_trainers_seeded_affine_order(shards: Path) -> None:
    """Pinned: the order the kit's trainer has always read shards in (runs and checkpoints keep their
    data)."""
    data = dataset(shards)
    assert data.samples_per_epoch == 204
    assert [data.window(i) for i in range(8)] == [3, 8, 13, 18, 23, 28, 33, 38]
    assert [data.window(204 + i) for i in range(8)] == [144, 37, 134, 27, 124, 17, 114, 7]
    for epoch in (0, 1):
        assert sorted(data.window(epoch * 204 + j) for j in range(204)) == list(range(204))
    stream = TokenShards(shards).read(0, 3277)
    for index in (0, 61, 204, 407):
        w = data.window(index)
        assert torch.equal(data.sample(index), torch.from_numpy(stream[w * 16 : w * 16 + 16]))
        assert data.sample(index).dtype == torch.int64


def test_each_rank_takes_its_micro_batches_of_the_global_batch_and_records_their_ids(shards: Path) -> None:
    ranks = [dataset(shards, world=2, rank=r) for r in range(2)]
    assert ranks[0].accum == 3  # 12 samples per step = 2 ranks x 3 micro-batches x 2
    for step in range(2):
        taken = []
        for data in ranks:
            batches = list(data.step_batches())
            assert len(batches) == 3
            for m, (inputs, targets) in enumerate(batches):
                assert inputs.shape == targets.shape == (2, SEQ) and inputs.dtype == torch.int64
                assert torch.equal(inputs[:, 1:], targets[:, :-1])
                ids = data.step_samples[2 * m : 2 * m + 2]
                assert ids == [12 * step + 4 * m + 2 * data.rank + i for i in range(2)]
                assert torch.equal(inputs, torch.stack([data.sample(i)[:-1] for i in ids]))
            taken += data.step_samples
        assert sorted(taken) == list(range(12 * step, 12 * step + 12))
    assert {d.samples_consumed for d in ranks} == {24}
    ranks[0].next_batch()  # one micro-batch taken alone: the step has begun
    with pytest.raises(
        RuntimeError, match=r"step_batches\(\) at global sample 28, inside a global batch of 12"
    ):
        next(ranks[0].step_batches())


def test_the_cursor_resumes_on_another_world_size_with_the_same_global_batches(shards: Path) -> None:
    """2 ranks for two steps, their state (one global cursor), then 3 ranks: every sample once, in order."""
    two = [dataset(shards, world=2, rank=r) for r in range(2)]
    seen = []
    for _ in range(2):
        for data in two:
            list(data.step_batches())
            seen += data.step_samples
    state = two[1].state_dict()
    assert state == two[0].state_dict() == {"samples_consumed": 24}
    three = [dataset(shards, world=3, rank=r) for r in range(3)]
    for data in three:
        data.load_state_dict(state)
        assert data.accum == 2
        list(data.step_batches())
        seen += data.step_samples
    assert seen != sorted(seen) and sorted(seen) == list(range(36))


def test_a_step_that_failed_before_its_update_reads_the_same_batches_again(shards: Path) -> None:
    model = torch.nn.Linear(2, 2)
    data = dataset(shards, world=2, rank=1)
    state = resilience.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                  data=data, rank=1, data_global=True)  # fmt: skip
    assert state.reshard_problem() is None
    list(data.step_batches())
    state.begin_step()
    first = [b[0] for b in data.step_batches()]
    ids = list(data.step_samples)
    assert state.live_step() == 0 and data.samples_consumed == 12 and data.step_samples == []
    again = [b[0] for b in data.step_batches()]
    assert data.step_samples == ids and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


# --- Megatron-LM's indexed datasets ----------------------------------------------------------------------

MEGATRON_DTYPE_CODES = {np.uint16: 8, np.int32: 4}


def write_megatron(
    prefix: Path, docs: list[np.ndarray], dtype: type, *, magic: bytes = b"MMIDIDX\x00\x00"
) -> None:
    """PREFIX.bin and PREFIX.idx as Megatron-LM's IndexedDatasetBuilder writes them (one sequence per
    document): the .bin is the documents' tokens back to back; the .idx is the 9-byte magic, version <Q 1,
    dtype code <B, sequence count <Q, document index count <Q (documents + 1), then int32 sequence lengths,
    int64 byte pointers and the int64 document indices 0..documents."""
    arrays = [np.asarray(doc, dtype=dtype) for doc in docs]
    Path(f"{prefix}.bin").write_bytes(b"".join(a.tobytes() for a in arrays))
    lengths = np.array([a.size for a in arrays], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))[:-1]]) * np.dtype(dtype).itemsize
    indices = np.arange(len(arrays) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as fh:
        fh.write(magic)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", lengths.size))
        fh.write(struct.pack("<Q", indices.size))
        fh.write(lengths.tobytes())
        fh.write(pointers.astype("<i8").tobytes())
        fh.write(indices.tobytes())


def documents(total: int = 3277) -> list[np.ndarray]:
    """The test stream (`stream_tokens`) cut into documents of uneven lengths, empty ones among them."""
    tokens, lengths = stream_tokens(total), [1, 0, 300, 57, 9, 211]
    out, pos = [], 0
    while pos < total:
        n = min(lengths[len(out) % len(lengths)], total - pos)
        out.append(tokens[pos : pos + n])
        pos += n
    return out


@pytest.mark.parametrize("dtype", [np.uint16, np.int32], ids=["uint16", "int32"])
def test_megatrons_files_read_back_as_the_same_stream_and_samples_as_the_kits_shards(
    tmp_path: Path, shards: Path, dtype: type
) -> None:
    docs = documents()
    prefix = tmp_path / "corpus_text_document"
    write_megatron(prefix, docs, dtype)
    stream = MegatronTokens(prefix)
    assert stream.index.documents.tolist() == list(range(len(docs) + 1))
    assert np.array_equal(stream.read(0, stream.num_tokens), np.concatenate(docs))
    kit = dataset(shards, world=3, rank=2)
    for given, start in ((prefix, 0), (f"{prefix}.bin", 192), (f"{prefix}.idx", 396)):  # 204 per epoch
        megatron = dataset(given, world=3, rank=2)
        assert megatron.samples_per_epoch == kit.samples_per_epoch == 204
        for data in (megatron, kit):
            data.load_state_dict({"samples_consumed": start})
        for _ in range(2):
            pairs = zip(megatron.step_batches(), kit.step_batches(), strict=True)
            assert all(torch.equal(m, k) for mb, kb in pairs for m, k in zip(mb, kb, strict=True))
            assert megatron.step_samples == kit.step_samples


def _bad(tmp_path: Path, shards: Path, case: str) -> tuple[Path, int]:
    """(path, the model's vocab) of one kind of bad input."""
    prefix = tmp_path / "mega"
    if case == "missing idx":
        write_megatron(prefix, documents(), np.uint16)
        Path(f"{prefix}.idx").unlink()
    elif case == "wrong magic":
        write_megatron(prefix, documents(), np.uint16, magic=b"TNTIDX\x00\x00\x00")
    elif case == "megatron vocab":
        write_megatron(prefix, documents(), np.int32)
        return prefix, 999
    elif case == "shards vocab":
        return shards, 512
    elif case == "truncated idx":
        write_megatron(prefix, documents(), np.uint16)
        idx = Path(f"{prefix}.idx")
        idx.write_bytes(idx.read_bytes()[:-8])
    elif case == "neither":
        return tmp_path / "nothing-here", VOCAB
    return prefix, VOCAB


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "missing idx",
            r"^Megatron-LM dataset '.*mega': mega\.idx is missing beside mega\.bin: pass the prefix ",
        ),
        (
            "wrong magic",
            r"^'.*mega\.idx' is not a Megatron-LM index \(magic b'TNTIDX\\x00\\x00\\x00', expected ",
        ),
        (
            "megatron vocab",
            r"^Megatron-LM dataset '.*mega' holds token id 999, outside the model's vocab of 999: ",
        ),
        ("shards vocab", r"^shards in '.*shards' use vocab size 1000 > the model's 512: pick a larger model"),
        (
            "truncated idx",
            r"^'.*mega\.idx' has \d+ bytes, its header \(\d+ sequences, \d+ document indices\) says ",
        ),
        (
            "neither",
            r"^--data-dir='.*nothing-here' is not a folder of token shards nor a Megatron-LM prefix ",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path: Path, shards: Path, case: str, message: str) -> None:
    path, vocab = _bad(tmp_path, shards, case)
    with pytest.raises(ValueError) as info:
        resilience.TokenDataset.check(path, seq_len=SEQ, vocab_size=vocab, option="--data-dir")
    assert re.search(message, str(info.value)) and "\n" not in str(info.value), str(info.value)
    with pytest.raises(ValueError, match=re.escape(str(info.value))):  # the constructor checks the same
        resilience.TokenDataset(
            path, seq_len=SEQ, plan=plan(1), rank=0, seed=0, vocab_size=vocab, option="--data-dir"
        )


def test_a_token_outside_the_vocab_past_the_checks_scan_is_refused_when_its_sample_is_read(
    tmp_path: Path,
) -> None:
    """A Megatron file records no vocab: the check reads SCAN_TOKENS ids, each sample is checked when read."""
    tokens = stream_tokens(SCAN_TOKENS + 2 * (SEQ + 1))
    tokens[SCAN_TOKENS + SEQ + 1 + 3] = 5000  # in the last window, past the scan
    prefix = tmp_path / "late"
    write_megatron(prefix, [tokens], np.int32)
    data = dataset(prefix)
    last = next(i for i in range(data.samples_per_epoch) if data.window(i) == data.samples_per_epoch - 1)
    data.sample(last - 1 if last else last + 1)
    with pytest.raises(
        ValueError, match=rf"^sample {last} of '.*late' holds token id 5000, outside the model"
    ):
        data.sample(last)
