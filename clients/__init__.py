"""Load generators and reports for a running dasc server (tritonclient over gRPC streams).

  workload.py     the synthetic MMLU-Pro-shaped prompt set (token ids, seeded) and capacity-boundary blocks
  protocol.py     the paper's matched-HBM protocol (App. C.2): flush -> fill -> shuffle -> timed replay
  client.py       closed-loop streaming requests, one gRPC connection per concurrent client; cache_control
  http_client.py  the same over HTTP: generate_stream read as SSE, TTFT to the first chunk (the default)
  cells.py        resumable runs: a manifest fixed before any run, one JSON per cell, merge checks
  runner.py       one call: the cells not yet done, arm by arm, the baseline beside each arm
  assemble.py     a measurement's result from its cells (what one unsplit run writes)
  multiturn.py    the fixed-slot suffix-refresh study (Table 8): multi-turn workload, per-hit cost
  inprocess.py    the same requests straight into an Engine (what Triton adds is the difference)
  arms.py         arm specs, matched-budget slots, dasc-build and the server of one arm
  report.py       per-seed/phase/arm figures (TTFT, input throughput, Eq. 9 hit rate), the table, the JSON
  plot.py         the comparison plot
  matched_hbm.py  the command line: `python -m clients.matched_hbm --help`
"""
