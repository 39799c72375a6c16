"""`make bench-noise`: the seeded Gumbel noise against a decode step."""
