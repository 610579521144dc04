"""The earlier import path of `vpo.eval.metrics` (pass@k, best@k, E_w[max], diversity), kept so
`from vpo.evaluation import pass_at_k` in users' code keeps working."""

from vpo.eval.metrics import *  # noqa: F403
