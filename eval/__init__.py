"""Evaluation: datasets → runner → per-record evidence → scores, comparisons, cost.

One package per idea, each with its own command module:

- ``eval.decisions``: the shipped tasks read through an engine, scores, comparisons, read-policy studies.
- ``eval.suite``: the public suite in Nimble's record format.
- ``eval.generation``: generated answers (GSM8K, BFCL simple), server throughput, the study's quoted tables.
- ``eval.capacity``: survey, load through the service, cost per million decisions, fleet plan.
- ``eval.evidence``: run directories (rows, manifests), Cloud Storage transfers, figures.

``eval.cli`` mounts their commands under ``decide``; ``eval.options`` holds options several of them declare.
"""
