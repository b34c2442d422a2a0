"""Model shapes by name: plain data (standard library only), so the memory plan, the config check and the job
CLI's render-time checks read them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = False
    """The output projection is the input embedding's matrix (Hugging Face `tie_word_embeddings`): one
    vocab_size x dim matrix in the parameters, not two. The kit's own model never ties."""

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"dim % n_heads and n_heads % n_kv_heads must be 0: {self}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def block_params(self) -> int:
        """Parameters of one block: q, k, v, o projections, the SwiGLU MLP and two norms."""
        attn = 2 * self.dim * self.dim + 2 * self.dim * self.kv_dim
        return attn + 3 * self.dim * self.ffn_dim + 2 * self.dim

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks: input embedding, output projection (the same matrix when tied),
        final norm."""
        return (1 if self.tied_embeddings else 2) * self.vocab_size * self.dim + self.dim

    def num_params(self) -> int:
        return self.n_layers * self.block_params + self.root_params


MODEL_CONFIGS: dict[str, ModelArgs] = {
    # ~4.0 M params: a full train/checkpoint/fault/restart scenario fits in seconds on 2 CPU cores.
    "tiny": ModelArgs(
        vocab_size=2048, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=688, max_seq_len=1024
    ),
    # ~125 M params: CPU checkpoint benchmarks (about a 1.5 GB checkpoint with AdamW state).
    "small": ModelArgs(
        vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, max_seq_len=2048
    ),
    # Llama 3.1 8B shape (8.03 B params), the study's model.
    "llama3.1-8b": ModelArgs(
        vocab_size=128256,
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
    # Llama 3.1 70B shape (70.6 B params): planning (`make plan`) and p5 memory plans.
    "llama3.1-70b": ModelArgs(
        vocab_size=128256,
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_dim=28672,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}
