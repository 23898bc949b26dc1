"""gpt-explain's renderers: a report (or a --steps trace) as text, HTML or PNG plots."""
