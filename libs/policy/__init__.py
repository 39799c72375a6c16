"""Policy versions on a machine that uses them: fetched through relays, verified, loaded."""
