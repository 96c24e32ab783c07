"""Parallel text made training data: `nmt preprocess` (preprocess) and its worker processes
(workers), the data directory it writes (datadir), memory-mapped ids and token batches (data),
what preprocessing shows (report), and data prepared as a model reads its text (from_model).

It imports the root's foundations, text/ and model/."""
