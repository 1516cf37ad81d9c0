"""One model's request path: plan the prompts, find the prefix, decode, calibrate, score."""
