"""What runs cost and what their records show, read after the fact and never by running a model: the chain formula
and fitted costs (speed_model), a round's cost against plain decoding (round_cost), chi-square tests that sampling is
lossless (lossless), and one way to write a table (markdown). It may import decode/."""
