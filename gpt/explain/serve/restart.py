"""Starting over in ``gpt-explain --serve``: the model's first weights and a fresh session.

The served session persists across page loads; the page's Reset asks for ``Restart(session)``'s
call, which puts the weights back as they were when the server started, forgets the optimizer's
moments and the history, and returns a new ``Session`` with the same settings (and, if given,
a new prompt).
"""

from __future__ import annotations

from ..report import prompt_ids
from ..steps import Session


class Restart:
    """Remembers ``session``'s model weights and settings (call it before the first step)."""

    def __init__(self, session: Session):
        s = session
        self.model, self.tokenizer, self.prompt = s.model, s.tokenizer, s.prompt
        self.weights = {n: t.clone() for n, t in s.model.state_dict().items()}
        self.settings = dict(
            layer=s.layer,
            head=s.head,
            position=s.position,
            settings=s.settings,  # a fresh optimizer: the run's moments again, or none
            seed=s.seed,
            max_tokens=s.max_tokens,
            follow=s.follow,
            checks=s.checks,
        )

    def __call__(self, prompt: str | None = None) -> Session:
        """A fresh session on the first weights; a bad prompt raises ValueError, changing nothing."""
        prompt = self.prompt if prompt is None else prompt
        cfg = self.model.config
        prompt_ids(self.tokenizer, prompt, cfg.block_size, self.settings["max_tokens"])
        self.model.load_state_dict(self.weights)
        self.model.zero_grad()
        return Session(self.model, self.tokenizer, prompt, **self.settings)
