"""`kit-export-hf`: a committed checkpoint of a run folder, as a Hugging Face model folder that
`AutoModelForCausalLM.from_pretrained` loads offline (docs/own-model.md, "Your model back").

- `steps`: which step (the newest commit that verifies, as resume picks it, or `--step N`), verified with the
  kit's own checks;
- `dcp_read`: where each model tensor's chunks lie in the rank files (DCP's `.metadata`, read in one place)
  and their bytes, piece by piece;
- `hf_source` (a model trained from a Hugging Face folder: its own parameter names, checked against its
  config.json) and `kit_llama` (the kit's own Llama: names mapped to LlamaForCausalLM's, a LlamaConfig);
- `stream` (one tensor at a time: chunks read, dtype converted, bytes written, never the whole state) and
  `safetensors_out` (headers computed from the metadata before any data, shards and their index);
- `export` (the folder: staged, then moved in), `cli` (the console script) and `errors` (the one-line
  refusal every module raises).
"""
