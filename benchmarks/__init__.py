"""The benchmarks: one entry point, ``python -m benchmarks NAME [ARGS]`` (``--help`` lists them), run from the
repository root. A benchmark is a module here with a ``__main__`` block; the others are the helpers they
share (results_io, shaped_model, copy_bandwidth, kernel_profile, prefix_reuse), imported as
``benchmarks.NAME``. results/ holds the latest result of each with the command that made it."""
