"""Generation evals: GSM8K and BFCL simple answers from an OpenAI-compatible server, scored and compared;
output-token throughput; the study's published generation tables, quoted."""
