"""The kit's data tools (`kit-prepare-data`, `kit-make-shards`): text in, the kit's token shards out.

`prepare_data` (tokenize text, JSON lines, Parquet or a `datasets` folder with a Hugging Face tokenizer;
`tokenizer_fingerprint`), `make_shards` (the dependency-free byte tokenizer). The format they write is the
API's (fsdpkit.resilience.dataset.format), which `resilience.TokenDataset` reads.
"""
