"""Parallel text made training data: `nmt preprocess` (preprocess) and its worker processes
(workers), the data directory it writes (datadir), memory-mapped ids and token batches (data),
and what preprocessing shows (report).

It imports the root's foundations, text/ and model/."""
