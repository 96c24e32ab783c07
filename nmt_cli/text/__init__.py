"""Text in and out of a model: the vocabulary and its special ids (vocab), Moses normalization and
tokenization (moses), joint BPE learned as subword-nmt learns it (bpe), SentencePiece (pieces),
and one language's way from a raw line to subword tokens and back (processor).

It imports the root's foundations only."""
