"""Tasks with vector rewards: prompts, answer format, in-graph or host rewards, demonstrations."""
