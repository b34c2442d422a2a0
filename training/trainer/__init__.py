"""The kit's own trainer, one user of the public API (`python -m fsdpkit.trainer`), and its data tools.

`train` (the loop), `config` (its typed sections beside the API's), `model` (a Llama-style decoder) and
`hf_model` (a Hugging Face causal LM from a local folder), `data` and `shards` (the token stream and its
format), `memory_plan` (refuse a job that cannot fit before a node is paid for); tools: `prepare_data`
(tokenize text with a Hugging Face tokenizer), `make_shards` (the byte tokenizer), `check_config`.
"""
