"""One speculation round and what it is made of: the engine (`Decoder.step`: plan, draft, verify, commit, record), the
token tree and its builder, the drafters, verification and sampling, the round planner with its calibration and the
cost curves it prices guesses by (planner, calibration, costs), each plan's reason in words for the views (reasons,
made outside the round), the trace record and its statistics (trace, metrics), phase clocks, and the tokens that end a
text. Its caller hands it caches and backends, so importing it loads no cache kind and no machine state. It may import
backends/interface.py."""
