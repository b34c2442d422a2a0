"""The streaming core of kit-export-hf, in one process: chunks located from DCP's metadata, read piece by
piece, converted and written as safetensors that the safetensors library reads back bitwise; the rotary
convention the kit's Llama shares with Hugging Face's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from export_helpers import save_step
from safetensors import safe_open
from safetensors.torch import load_file

from fsdpkit.export import dcp_read, safetensors_out
from fsdpkit.export.dcp_read import Chunk, StoredTensor
from fsdpkit.export.safetensors_out import OutTensor
from fsdpkit.export.stream import Scratch, copy_tensor, row_blocks


def _odd_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "a.weight": torch.randn(37, 11, generator=g),
        "transposed.weight": torch.randn(9, 13, generator=g).t(),  # saved with its strides (not row-major)
        "scalar": torch.tensor(3.25),
        "empty.weight": torch.empty(0, 4),
        "counts": torch.arange(10, dtype=torch.int64),
        "half.weight": torch.randn(5, 3, generator=g).to(torch.float16),
        "brain.weight": torch.randn(7, generator=g).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
    }


def _export(folder: Path, out: Path, dtype: torch.dtype, *, piece_bytes: int, max_bytes: int) -> list[Path]:
    tensors = dcp_read.model_tensors(folder)
    outs = [OutTensor(t.name, t, safetensors_out.out_dtype(t.dtype, dtype)) for t in tensors]
    shards = safetensors_out.plan(outs, max_bytes)
    out.mkdir()
    scratch = Scratch()
    with dcp_read.ChunkReader(folder, piece_bytes=piece_bytes) as reader:
        for shard in shards:
            safetensors_out.write_shard(
                out / shard.name,
                shard,
                lambda fd, t: copy_tensor(
                    fd, reader, t.source, t.dtype, step=1, piece_bytes=piece_bytes, scratch=scratch
                ),
            )
    if (doc := safetensors_out.index(shards)) is not None:
        (out / safetensors_out.INDEX_FILE).write_text(json.dumps(doc))
    return [out / s.name for s in shards]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_layout_and_dtype_streams_bitwise_through_small_pieces(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    source = _odd_tensors()
    folder = save_step(tmp_path / "run", 1, source)
    with dcp_read.ChunkReader(folder) as reader:  # the whole-chunk path is taken too
        t = next(t for t in dcp_read.model_tensors(folder) if t.name == "transposed.weight")
        assert not reader.layout(t.name, t.chunks[0], t.dtype).in_place
    files = _export(folder, tmp_path / "out", dtype, piece_bytes=24, max_bytes=10**9)
    assert [f.name for f in files] == ["model.safetensors"]
    got = load_file(files[0])
    assert set(got) == set(source)
    for name, value in source.items():
        want = value.to(dtype) if value.is_floating_point() else value
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert torch.equal(got[name], want.contiguous()), name


def test_shards_split_at_the_size_limit_with_an_index_of_every_tensor(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    source = {f"layer{i}.weight": torch.randn(64, 16, generator=g) for i in range(5)}  # 4 KiB each
    source["big.weight"] = torch.randn(64, 80, generator=g)  # 20 KiB: a file of its own
    folder = save_step(tmp_path / "run", 3, source)
    files = _export(folder, tmp_path / "out", torch.float32, piece_bytes=1000, max_bytes=9000)
    assert [f.name for f in files] == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    index = json.loads((tmp_path / "out" / safetensors_out.INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for v in source.values())
    assert set(index["weight_map"]) == set(source)
    for name, file in index["weight_map"].items():
        with safe_open(tmp_path / "out" / file, framework="pt") as f:
            assert torch.equal(f.get_tensor(name), source[name]), name
    assert all(f.stat().st_size <= 9000 + 200 or "00004" in f.name for f in files)


def test_only_the_model_is_read_not_the_optimizer_nor_the_step(tmp_path: Path) -> None:
    folder = save_step(tmp_path / "run", 2, {"w": torch.ones(3)}, optim=True)
    tensors = dcp_read.model_tensors(folder)
    assert [(t.name, t.shape, t.dtype) for t in tensors] == [("w", (3,), torch.float32)]


def _tensor(shape: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> StoredTensor:
    return StoredTensor("t", torch.float32, shape, tuple(Chunk(o, s, "f", 0, 0) for o, s in chunks))


def test_row_blocks_are_streamed_other_cuts_are_assembled() -> None:
    rows = _tensor((10, 4), [((5, 0), (5, 4)), ((0, 0), (5, 4))])
    assert [c.offsets for c in row_blocks(rows)] == [(0, 0), (5, 0)]
    uneven = _tensor((10, 4), [((0, 0), (7, 4)), ((7, 0), (3, 4)), ((10, 0), (0, 4))])  # an empty last shard
    assert [c.sizes for c in row_blocks(uneven)] == [(7, 4), (3, 4)]
    assert row_blocks(_tensor((10, 4), [((0, 0), (10, 2)), ((0, 2), (10, 2))])) is None  # cut along dim 1
    assert row_blocks(_tensor((10, 4), [((0, 0), (4, 4)), ((5, 0), (5, 4))])) is None  # a gap
    assert row_blocks(_tensor((), [((), ())])) is None  # a scalar: assembled (one value)


def test_the_kit_rotates_halves_exactly_as_hugging_face_llama() -> None:
    """The kit's `apply_rope` and HF's `apply_rotary_pos_emb` (rotate_half) agree bitwise, so q and k are
    exported as they are (Meta's interleaved convention would need HF's permutation)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from fsdpkit.contracts.shapes import MODEL_CONFIGS
    from fsdpkit.trainer.model import apply_rope, rope_tables

    args = MODEL_CONFIGS["tiny"]
    config = LlamaConfig(hidden_size=args.dim, num_attention_heads=args.n_heads, head_dim=args.head_dim,
                         max_position_embeddings=args.max_seq_len, rope_theta=args.rope_theta)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, args.n_heads, 50, args.head_dim, generator=g)
    k = torch.randn(2, args.n_kv_heads, 50, args.head_dim, generator=g)
    cos, sin = rope_tables(args)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(q, torch.arange(50)[None].expand(2, -1))
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    assert torch.equal(apply_rope(q, cos[:50], sin[:50]), hf_q)
    assert torch.equal(apply_rope(k, cos[:50], sin[:50]), hf_k)
