"""The kit's own trainer, one user of the public API (`python -m fsdpkit.trainer`).

`train` (the loop), `config` (its typed sections beside the API's), `model` (a Llama-style decoder) and
`hf_model` (a Hugging Face causal LM from a local folder), `data` (the synthetic stream; token shards and
Megatron-LM datasets are read by the API's `resilience.TokenDataset`), `memory_plan` (refuse a job that
cannot fit before a node is paid for); tool: `check_config`. The data tools are fsdpkit.data.
"""
