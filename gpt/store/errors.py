"""The errors of gpt.store: each message is one line naming the file and what is wrong."""


class CheckpointError(Exception):
    """A checkpoint is missing, unreadable or does not fit (message says which file)."""


class LockError(Exception):
    """The run directory is held by another live process (the message names its PID)."""
