"""Capacity planning: which models fit a chip, load through the service, cost per million decisions, and
the fleet a decision rate needs."""
