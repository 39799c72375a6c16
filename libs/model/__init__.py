"""Any local Hugging Face causal LM through transformers: loading, the tiny seeded model the
project builds for tests and the local run, and the generation backends."""
