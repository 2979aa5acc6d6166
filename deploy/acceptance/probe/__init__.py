"""Issue 29's acceptance probe of a real ``decide serve``: ``python -m deploy.acceptance.probe`` (see run.py)."""
