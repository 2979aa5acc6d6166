"""Evaluation: datasets → runner → per-record evidence → scores, comparisons, cost."""
