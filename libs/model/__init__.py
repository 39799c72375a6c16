"""The project's tiny Hugging Face-format causal LM: tokenizer, architecture, IO and builder."""
