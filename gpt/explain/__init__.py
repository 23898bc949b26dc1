"""gpt-explain: one training step of a GPT on one prompt, shown stage by stage, with evidence.

report.py    explain(model, tokenizer, prompt): runs the step, returns a JSON-able report
record.py    the model's own forward, run as written and watched (forward hooks, op observer)
stages.py    what it recorded, named as GPT-2's stages (an edit shows as what ran)
where.py     the file and lines of each stage: found in the code, never written down
arrays.py    small helpers: host copies, norms, the 2-D slice of a stage the pages draw
checks.py    the evidence: float64 finite differences, the embedding's gradient split
lens.py      inside the prediction: the logit lens and per-head ablation
steps.py     Session and follow_steps: many steps on one prompt, chosen weights followed
run.py       the AdamW step taken: a run's next one (settings, moments, lr, clipping) or assumed
render/      text.py (terminal), html.py (one page), steps.py (--steps), plots.py (PNG);
             fmt.py and svg.py hold what they share
serve/       gpt-explain --serve: server.py and the page it serves (page.html)
cli.py       the gpt-explain command
"""

from .cli import main
from .render.html import render_html
from .render.text import render_text
from .report import MAX_TOKENS, explain, prompt_ids, prompt_tokenizer

__all__ = ["MAX_TOKENS", "explain", "main", "prompt_ids", "prompt_tokenizer", "render_html",
           "render_text"]  # fmt: skip
