"""Token data for a training script (the API's `TokenDataset`), and the formats it reads.

`tokens` (`TokenDataset`: the seeded sample order, the global cursor, the BatchPlan's split, the audit of
each step's samples), `format` (the kit's KITTOK01 shards: read, write, check, tokenizer fingerprint; the
data tools in fsdpkit.data write them), `megatron` (Megatron-LM's .bin/.idx pairs), `stream` (spans of
memory-mapped arrays read as one stream). Numpy only, but for the tensors a batch is made of.

Import from the submodules; this file imports nothing.
"""
