"""The public suite in Nimble's record format: its records, a run through an engine, its scorecard and table."""
