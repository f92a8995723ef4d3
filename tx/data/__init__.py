"""Input pipeline: sources -> SentencePiece -> token id cache -> token-budget batches."""
