"""Issue 39's probe: can one caller starve or stall the others? (``run.py``)"""
