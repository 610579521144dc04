"""Evolutionary search with the policy as mutation operator: population operators
(`population`), the in-graph island search on the mesh (`ingraph`) and the same search for
host-scored tasks (`host`)."""
