"""Acceptance tools: the real service on loopback, asked what a user or an operator would ask.

The probe and the soak print each goal PASS/FAIL and exit 1 when one fails; the fault runs count every
response by status. Not benchmarks (bench/ prints ratios) and not tests (they run for minutes on a quiet
machine and write evidence/). Each runs as a module from the repository root:

- ``python -m deploy.acceptance.probe``: issue 29's probe of a real ``decide serve``, then and now per row;
- ``python -m deploy.acceptance.soak``: three tenants' mixed traffic for a fixed time;
- ``python -m deploy.acceptance.service_faults``: a bounded load, the vLLM-CPU engine killed and restarted
  in the middle if asked.
"""
