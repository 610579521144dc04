"""`vpo serve`: an OpenAI-compatible HTTP endpoint on the jitted sampler (`vpo.serve.protocol`,
`vpo.serve.engine`, `vpo.serve.app`)."""
