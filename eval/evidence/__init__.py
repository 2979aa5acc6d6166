"""Run directories: per-record rows, the manifest beside them, Cloud Storage transfers and figures.

Everything the other eval packages write or read back goes through here, so a report regenerates offline
from the files alone.
"""
