"""Everything a run keeps on disk, and the checks before it is trusted.

- `checkpoint`: safetensors + JSON files written atomically; Hugging Face GPT-2 directories
- `run_checkpoint`: a gpt-train run's latest and best checkpoints (what --resume reads)
- `model_code`: the digest of the model's code a checkpoint records, and what changed since
- `validate`: schema, header and memory checks that run before anything is allocated
- `lock`: one writer per run directory
- `owned_dir`: directories gpt-export writes whole, recognised by their manifest
- `errors`: the exceptions all of these raise, each one line naming the file
"""
