"""A Hugging Face model folder as the kit's model: its config in the memory plan, one-line refusals of bad
folders, and the FSDP2 build (random init, forward, loading per shard, training) on 1 and 2 gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_memory_plan import P5  # one p5 job for both plans

from fsdpkit.contracts.hf_config import HfModelError, check_tokenizer, hf_shape, read_hf_config
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.trainer.hf_model import check_weights
from fsdpkit.trainer.memory_plan import MemoryPlanError, plan, plan_line

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
LLAMA_8B = HF / "llama-3.1-8b"
TINY = HF / "tiny-llama"


def model_folder(tmp_path: Path, name: str = "model", **changes) -> Path:
    """A copy of the tiny config with `changes`, in the folder `name`."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    config = json.loads((TINY / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# -- the memory plan from config.json ------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [2, 4, 16])
@pytest.mark.parametrize("ac", ["selective", "full"])
def test_the_8b_config_plans_like_the_kits_llama_on_p5(nodes, ac):
    shape = hf_shape(read_hf_config(LLAMA_8B))
    job = P5 | {"world_size": 8 * nodes, "seq_len": 8192, "ac": ac}
    hf, kit = plan(shape, **job), plan(MODEL_CONFIGS["llama3.1-8b"], **job)
    assert abs(hf.device_total - kit.device_total) <= 0.05 * kit.device_total
    assert abs(hf.params - kit.params) <= 0.05 * kit.params
    assert shape.num_params() == 8_030_261_248 and shape.max_seq_len == 131072 and shape.rope_theta == 5e5


def test_the_8b_config_is_refused_where_it_cannot_fit():
    cfg = SimpleNamespace(
        data=SimpleNamespace(seq_len=8192, batch_size=1),
        model=SimpleNamespace(activation_checkpointing="none"),
        checkpoint=SimpleNamespace(mode="async", backend="kit", tiers="auto", tier_keep=1),
    )
    shape = hf_shape(read_hf_config(LLAMA_8B))
    job = {k: P5[k] for k in ("ranks_per_node", "device_capacity", "host_capacity", "on_gpu")}
    with pytest.raises(
        MemoryPlanError, match=r"^the job needs .* per GPU .*activation_checkpointing="
    ) as err:
        plan_line(cfg, shape, world=8, **job)
    assert "\n" not in str(err.value)
    cfg.model.activation_checkpointing = "full"  # a stand-in config (SimpleNamespace), not the frozen one
    assert plan_line(cfg, shape, world=16, **job).startswith("memory plan: ")


def test_tied_embeddings_count_one_matrix():
    config = read_hf_config(TINY)
    untied, tied = hf_shape(config), hf_shape(config | {"tie_word_embeddings": True})
    assert untied.num_params() - tied.num_params() == 512 * 64
    assert (
        plan(tied, world_size=1, seq_len=64, ac="none", **P5).unsharded
        < plan(untied, world_size=1, seq_len=64, ac="none", **P5).unsharded
    )


def test_hf_shape_counts_the_hf_models_parameters(tmp_path: Path):
    import torch

    from fsdpkit.trainer.hf_model import _hf_config, _meta_model

    for folder in (TINY, LLAMA_8B, model_folder(tmp_path, tie_word_embeddings=True)):
        config = read_hf_config(folder)
        model = _meta_model(_hf_config(folder))
        assert sum(p.numel() for p in model.parameters()) == hf_shape(config).num_params(), folder
        assert isinstance(model.model.layers[0].mlp.up_proj.weight, torch.nn.Parameter)


# -- bad input, one line each -----------------------------------------------------------------------------


def refused(call, match: str) -> str:
    with pytest.raises(HfModelError, match=match) as err:
        call()
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_a_missing_folder_a_file_and_a_folder_without_config_are_refused(tmp_path: Path):
    refused(lambda: read_hf_config(tmp_path / "nope"), r"model folder .*nope does not exist")
    (tmp_path / "file").write_text("x")
    refused(lambda: read_hf_config(tmp_path / "file"), r"model folder .*file is a file")
    refused(lambda: read_hf_config(tmp_path), r"config.json does not exist")


def test_a_config_that_is_not_json_or_not_utf8_is_refused(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64,')
    refused(lambda: read_hf_config(tmp_path), r"config.json is not JSON: .* line 1")
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff"}')
    refused(lambda: read_hf_config(tmp_path), r"config.json is not UTF-8 text")
    (tmp_path / "config.json").write_text("[1]")
    refused(lambda: read_hf_config(tmp_path), r"holds a JSON list, not an object")


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path: Path):
    folder = model_folder(tmp_path, architectures=["BertForMaskedLM"])
    refused(lambda: read_hf_config(folder), r"describes BertForMaskedLM, not a causal LM")
    model_folder(tmp_path, architectures=[])
    refused(lambda: read_hf_config(folder), r"names no architectures")


def test_missing_or_bad_sizes_are_refused(tmp_path: Path):
    config = json.loads((TINY / "config.json").read_text())
    del config["vocab_size"], config["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    refused(lambda: read_hf_config(tmp_path), r"lacks intermediate_size, vocab_size")
    folder = model_folder(tmp_path, hidden_size=0)
    refused(lambda: read_hf_config(folder), r"hidden_size=0 must be a positive integer")


def test_a_head_dim_the_plan_cannot_count_is_refused():
    config = read_hf_config(TINY) | {"head_dim": 32}
    refused(lambda: hf_shape(config), r"head_dim=32 x num_attention_heads=4 != hidden_size=64")


def test_a_tokenizer_larger_than_the_vocabulary_is_refused():
    config = read_hf_config(TINY)
    check_tokenizer(512, config)
    refused(
        lambda: check_tokenizer(513, config),
        r"the tokenizer has 513 tokens but the model's vocab_size is 512",
    )


def tiny_weights(**changes):
    """The tiny model's parameter shapes as zero tensors, with shapes changed by name (None: dropped)."""
    import torch

    from fsdpkit.trainer.hf_model import _hf_config, _meta_model

    model = _meta_model(_hf_config(TINY))
    tensors = {name: torch.zeros(p.shape) for name, p in model.named_parameters()}
    for name, shape in changes.items():
        if shape is None:
            del tensors[name]
        else:
            tensors[name] = torch.zeros(shape)
    return tensors


def test_weights_whose_shapes_differ_from_the_config_are_refused(tmp_path: Path):
    from safetensors.torch import save_file

    folder = model_folder(tmp_path)
    up, gate = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.gate_proj.weight"
    save_file(
        tiny_weights(**{up: (96, 64), gate: (128, 32), "lm_head.weight": None}), folder / "model.safetensors"
    )
    message = refused(
        lambda: check_weights(folder), r"^weights in .* do not match config.json \(3 mismatches\): "
    )
    assert f"{up} is [96, 64] in the file, [128, 64] in the config" in message
    assert "lm_head.weight is missing from the file" in message
    save_file(tiny_weights(**{"extra.weight": (2,)}), folder / "model.safetensors")
    refused(lambda: check_weights(folder), r"\(1 mismatch\): extra.weight is in the file, not in the model$")
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    refused(lambda: check_weights(folder), r"model.safetensors is not a safetensors file")


def test_a_tied_model_may_leave_its_output_projection_out_of_the_file(tmp_path: Path):
    from safetensors.torch import save_file

    folder = model_folder(tmp_path, tie_word_embeddings=True)
    save_file(tiny_weights(**{"lm_head.weight": None}), folder / "model.safetensors")
    check_weights(folder)


# -- one process: build, init, forward, load, train -------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    """A 1-rank gloo group on an in-memory store, deterministic algorithms on while it lives."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
        torch.use_deterministic_algorithms(was)


def build(folder: Path, mesh, **kwargs):
    import torch

    from fsdpkit.trainer.hf_model import build_hf_model

    return build_hf_model(folder, mesh=mesh, device=torch.device("cpu"), seed=kwargs.pop("seed", 0), **kwargs)


def full_state(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def plain_model(folder: Path, state: dict):
    """The same model without FSDP2, holding `state`."""
    from fsdpkit.trainer.hf_model import _hf_config, _transformers

    model = _transformers().AutoModelForCausalLM.from_config(_hf_config(folder), attn_implementation="sdpa")
    model.load_state_dict(state, strict=True)
    return model


def batch(seed: int, vocab: int = 512, shape=(2, 32)):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g), torch.randint(0, vocab, shape, generator=g)


def saved_tensors(model, inputs) -> int:
    """How many tensors a forward of `model` saves for backward."""
    import torch

    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=inputs)
    return count


def test_random_init_is_bitwise_repeatable_and_seeded(mesh, tmp_path: Path):
    import torch

    first, second, other = (full_state(build(TINY, mesh, seed=s)) for s in (7, 7, 8))
    assert first.keys() == second.keys() and len(first) == 21
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    assert torch.equal(first["model.norm.weight"], torch.ones(64))
    assert 0.015 < first["model.layers.0.mlp.up_proj.weight"].std() < 0.025
    padded = full_state(build(model_folder(tmp_path, pad_token_id=3), mesh))["model.embed_tokens.weight"]
    assert not padded[3].any() and padded[2].all()


@pytest.mark.parametrize("ac", ["none", "full"])
def test_forward_and_gradients_match_the_plain_model(mesh, ac):
    import torch

    from fsdpkit.trainer.hf_model import hf_loss

    sharded = build(TINY, mesh, seed=3, activation_checkpointing=ac)
    plain = plain_model(TINY, full_state(sharded))
    inputs, targets = batch(0)
    loss, reference = hf_loss(sharded, inputs, targets), hf_loss(plain, inputs, targets)
    assert torch.equal(loss, reference)
    assert torch.equal(sharded(input_ids=inputs).logits, plain(input_ids=inputs).logits)
    loss.backward()
    reference.backward()
    grad = sharded.model.layers[0].self_attn.q_proj.weight.grad.full_tensor()
    torch.testing.assert_close(grad, plain.model.layers[0].self_attn.q_proj.weight.grad, rtol=1e-5, atol=1e-7)
    if ac == "full":  # only each layer's inputs are kept: far fewer saved tensors than without
        assert saved_tensors(sharded, inputs) < saved_tensors(plain, inputs) / 2


def test_weights_load_from_the_file_exactly(mesh, tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    folder = model_folder(tmp_path)
    saved = {k: v.to(torch.bfloat16) for k, v in full_state(build(TINY, mesh, seed=5)).items()}
    save_file(saved, folder / "model.safetensors")
    model = build(folder, mesh, seed=99)
    loaded = full_state(model)
    assert loaded.keys() == saved.keys()
    assert all(loaded[k].dtype == torch.float32 and torch.equal(loaded[k], saved[k].float()) for k in saved)
    inputs, _ = batch(2)  # the rotary tables were recomputed on the sharded model: same logits
    assert torch.equal(model(input_ids=inputs).logits, plain_model(folder, loaded)(input_ids=inputs).logits)
    rebuilt = full_state(build(folder, mesh, load_weights=False, seed=99))
    assert not torch.equal(rebuilt["lm_head.weight"], loaded["lm_head.weight"])


def test_an_uninitialised_model_restores_every_value(mesh):
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    source = full_state(build(TINY, mesh, seed=4))
    model = build(TINY, mesh, init_weights=False)
    set_model_state_dict(
        model, dict(source), options=StateDictOptions(full_state_dict=True)
    )  # it rewrites the dict
    inputs, _ = batch(3)
    assert torch.equal(model(input_ids=inputs).logits, plain_model(TINY, source)(input_ids=inputs).logits)


def test_the_sharded_init_of_gpus_is_hfs_init(mesh, tmp_path: Path):
    """The path a GPU takes (init after sharding), run on the CPU mesh."""
    import warnings

    import torch

    from fsdpkit.trainer.hf_model import _init_sharded

    folder = model_folder(tmp_path, pad_token_id=3)
    states = []
    for _ in range(2):
        model = build(folder, mesh, init_weights=False)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "DTensor random operators may not have complete support")
            _init_sharded(model, seed=11)
        states.append(full_state(model))
    first, second = states
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert torch.equal(first["model.layers.1.input_layernorm.weight"], torch.ones(64))
    assert 0.015 < first["lm_head.weight"].std() < 0.025
    assert not first["model.embed_tokens.weight"][3].any()


def test_loss_falls_over_20_adamw_steps_with_bf16_compute(mesh):
    import torch

    from fsdpkit.trainer.hf_model import hf_loss

    model = build(TINY, mesh, param_dtype=torch.bfloat16, activation_checkpointing="selective")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs, targets = batch(1)
    losses = []
    for _ in range(20):
        loss = hf_loss(model, inputs, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[0] > 6.0 and losses[-1] < losses[0] - 2.0, losses


# -- two ranks: each loads its own shards -----------------------------------------------------------------


def _two_rank_worker(rank: int, tmp: str) -> None:
    """Load the sharded checkpoint of `tmp`/model; init the padded model of `tmp`/padded after sharding;
    rank 0 saves the seeded CPU init for the parent to compare with 1 rank's."""
    import warnings

    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh

    from fsdpkit.trainer.hf_model import _init_sharded

    root = Path(tmp)
    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=rank, world_size=2)
    try:
        torch.use_deterministic_algorithms(True)
        mesh = init_device_mesh("cpu", (2,))
        model = build(root / "model", mesh)
        assert model.model.embed_tokens.weight.to_local().shape[0] == (257, 256)[rank]
        state = full_state(model)
        inputs, _ = batch(4, vocab=513)
        logits = model(input_ids=inputs).logits
        padded = build(root / "padded", mesh, init_weights=False)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "DTensor random operators may not have complete support")
            _init_sharded(padded, seed=0)
        embedding = full_state(padded)["model.embed_tokens.weight"]
        seeded = full_state(build(TINY, mesh, seed=7))
        if rank == 0:
            saved = load_file(root / "model" / "a.safetensors") | load_file(root / "model" / "b.safetensors")
            assert state.keys() == saved.keys()
            bad = [k for k in saved if not torch.equal(state[k], saved[k])]
            assert not bad, bad
            assert torch.equal(logits, plain_model(root / "model", saved)(input_ids=inputs).logits)
            assert not embedding[300].any() and embedding[299].all() and embedding[301].all()
            torch.save(seeded, root / "seeded.pt")
    finally:
        dist.destroy_process_group()
    # As the trainer leaves (fsdpkit.runtime.process_exit): the interpreter's teardown of torch's C++ state
    # aborts now and then ("terminate called without an active exception", SIGABRT), failing a rank whose
    # work succeeded.
    from fsdpkit.runtime.process_exit import leave

    leave(0)


def test_two_ranks_load_their_shards_and_reassemble_the_file(mesh, tmp_path: Path):
    """An uneven vocabulary (513 rows over 2 ranks) in a two-file sharded checkpoint; a padding row in the
    second rank's shard; and the seeded CPU init the same on 2 ranks as on 1."""
    import torch
    import torch.multiprocessing as mp
    from safetensors.torch import save_file

    folder = model_folder(tmp_path, vocab_size=513)
    model_folder(tmp_path, "padded", pad_token_id=300)
    g = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(v.shape, generator=g) * 0.02 for k, v in tiny_weights().items()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = torch.randn(513, 64, generator=g) * 0.02
    names = sorted(tensors)
    half = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    for file, keys in half.items():
        save_file({k: tensors[k] for k in keys}, folder / file)
    weight_map = {k: file for file, keys in half.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    check_weights(folder)
    mp.spawn(_two_rank_worker, args=(str(tmp_path),), nprocs=2, join=True)
    two, one = torch.load(tmp_path / "seeded.pt"), full_state(build(TINY, mesh, seed=7))
    assert two.keys() == one.keys() and all(torch.equal(two[k], one[k]) for k in one)


def test_a_tied_model_loads_its_one_matrix(mesh, tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    folder = model_folder(tmp_path, tie_word_embeddings=True)
    g = torch.Generator().manual_seed(1)
    tensors = {
        k: torch.randn(v.shape, generator=g) for k, v in tiny_weights(**{"lm_head.weight": None}).items()
    }
    save_file(tensors, folder / "model.safetensors")
    model = build(folder, mesh)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight.full_tensor(), tensors["model.embed_tokens.weight"])


def test_an_index_naming_a_missing_shard_is_refused(tmp_path: Path):
    folder = model_folder(tmp_path)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "gone.safetensors"}})
    )
    refused(
        lambda: check_weights(folder), r"gone.safetensors does not exist \(named by model.safetensors.index"
    )


def test_a_model_type_transformers_does_not_know_is_refused(tmp_path: Path):
    folder = model_folder(tmp_path, model_type="nonsense")
    refused(lambda: check_weights(folder), r"transformers cannot read .* \(model_type 'nonsense'\): ")
