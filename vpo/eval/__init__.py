"""Judging policies: search-aware metrics (`metrics`: pass@k, best@k, E_w[max], diversity),
budget-fair evaluation of policies (`policies`), verdicts over paired seeds (`claims`), the
entropy law (`entropy_law`) and PNG plots (`plots`)."""
