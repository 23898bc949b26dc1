"""In-place parameter initialisers, as ``torch.nn.init`` (no graph is recorded)."""
