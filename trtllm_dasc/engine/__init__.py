"""Engine: scheduler and runner (match -> load -> prefill with checkpoint stores -> decode) and `dasc logits`."""
