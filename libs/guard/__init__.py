"""Defences shared by every process that reads bytes from strangers: bounded JSON parsing, a body
cap that holds whatever the framing, error replies that never echo input, and rate limits."""
