"""Frozen against learning island search at equal candidate budget (exploratory).

Does one policy-gradient step per generation on the search's own children (`vpo search
--learn`, `vpo.search.learn`) solve more hard problems than the frozen island search with the
same warm start, the same keys and the same candidate budget?

Design, fixed before the main run (the defaults below):

- Policy: the default `vpo compare` preset's warm start (`vpo.compare.driver.warm_start`: the
  tiny model trained from scratch by SFT, 6000 steps of 32 rows, m in {1, 3}, half of the rows
  search mutation prompts with 2 parents), cached in `--out`/sft.
- Problems: the preset's search problems (`vpo.compare.search_leg.hard_problems`: the
  `search_problems` = 32 of the `search_pool` = 32 problems of split 5151 the warm start's
  sampling finds hardest, i.e. that whole pool).
- Search: the preset's island search (2 islands x 6 members, 2 parents, 6 children, 19
  generations, temperature 0.7: 12 + 19 x 12 = 240 candidates per problem). Frozen search in
  m = 1 and m = 3; learning search with grpo and entropic at m = 1 and vpo at m = 3 (vpo scores
  a set, m >= 2; entropic needs >= 3 calls per island and generation, C / m = 2 at m = 3), each
  against the frozen search in its own m. Learning: LoRA rank 8 adapters (`LearnConfig`'s
  default), Adam with global-norm clipping 1, no KL, one update per generation from the mean
  loss over all 32 problems' islands (one policy per search seed, shared by the problems).
- Unit: the search seed s (0 .. `--seeds` - 1; key fold_in(key(5151 + 1), s), the compare
  search stage's keys), every method searching the 32 problems once with that key, so at a
  learning rate of 0 the learning search is the frozen one bit for bit.
  Statistic: per seed, problems solved at 240 candidates, learning minus frozen (same m);
  mean +- 95% Student-t interval, sign counts, one-sided p = max(paired t, exact sign flip)
  (`vpo.eval.claims.compare_values`), verdict at 2.5% per side, Holm over the 3 solved claims.
  Exploratory: one task, one warm start, one budget.
- Learning rate: a pilot before the main run on problems and seeds the main run does not use
  (`PILOT_SPLIT`, `PILOT_SEEDS`): each objective at each rate of `--rates`; the rate with the
  most pilot problems solved at 240 candidates, ties to the higher mean best fitness, then to
  the smaller rate.

Writes `--docs`.md (the report) and `--docs`/solved.png, summary.json; every run's record is
cached in `--out`/runs (a rerun reuses them). Prints the wall time.

Run:  python experiments/search_learn_compare.py --out runs/search_learn
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time

import jax
import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import search_leg
from vpo.compare.config import make_config
from vpo.compare.driver import warm_start
from vpo.config import LearnConfig
from vpo.eval import claims
from vpo.rl.search_update import make_learner
from vpo.search import ingraph
from vpo.search import learn as learn_lib

PILOT_SPLIT = 7171  # the pilot's problems: a split of their own (the main run's is 5151)
PILOT_SEEDS = (100,)  # the pilot's search seeds (the main run's: 0 .. --seeds - 1)
LEARNERS = {"grpo": 1, "entropic": 1, "vpo": 3}  # objective: the m it searches in
RATES = (1e-3, 3e-3, 1e-2)
# a comparison outside the solved family: its verdict read as a direction, not a claim
DESCRIPTIVE = {"reproduced": "higher (descriptive)", "refuted": "lower (descriptive)",
               "inconclusive": "not separated (descriptive)"}


# -- runs --------------------------------------------------------------------------------------

def search_key(cfg, seed: int):
    """Search seed `seed`'s key: the compare search stage's (`search_leg.SEARCH_KEY`)."""
    return jax.random.fold_in(jax.random.key(cfg.search_split_seed + search_leg.SEARCH_KEY), seed)


def curves(trace) -> dict:
    """A batched trace [N, G + 1] as per-point curves over the N problems: candidates per
    problem, problems solved, mean best fitness, mean population reward-space diversity, and
    each problem's first solving point (-1: never)."""
    solved = np.asarray(trace.solved, bool)
    return {"evaluated": np.asarray(trace.evaluated)[0].astype(int).tolist(),
            "solved": solved.sum(0).astype(int).tolist(),
            "best_fitness": np.asarray(trace.best_fitness, float).mean(0).tolist(),
            "diversity": np.asarray(trace.diversity, float).mean(0).tolist(),
            "first_P": search_leg.first_solved(solved, 1, solved.shape[0])[0].tolist()}


def frozen_record(policy, task, problems, scfg, key) -> dict:
    """The frozen island search on the batch (the model with the learning search's zero LoRA
    adapters, so both run the same program up to the update)."""
    model = learn_lib.trainable_model(policy, LearnConfig())
    t0 = time.perf_counter()
    trace = ingraph.run_method(key, "search", model, task, problems, scfg).trace
    return {**curves(trace), "seconds": time.perf_counter() - t0}


def learning_record(policy, task, problems, scfg, objective: str, rate: float, key) -> dict:
    """The learning island search on the batch at `rate` (a traced value: one compile per
    objective and shape), with the update's metrics per generation (`entropy`: the policy's
    mean token entropy on that generation's children, before its update)."""
    t0 = time.perf_counter()
    out = learn_lib.learning_run(key, policy, task, problems, scfg,
                                 LearnConfig(objective=objective), make_learner,
                                 learning_rate=rate)
    metrics = {k: np.asarray(v, float).tolist() for k, v in out.metrics.items()}
    return {**curves(out.trace), "metrics": metrics, "updates": int(out.state.updates),
            "rate": rate, "seconds": time.perf_counter() - t0}


def cached(path: str, make) -> dict:
    """The JSON record at `path`, or `make()` written there first."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    record = make()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    return record


def run_methods(policy, task, records, cfg, seed: int, rates: dict, folder: str, log) -> dict:
    """Every method on `records` with search seed `seed`: frozen in each m, each learner at its
    rate → {method name: record}, cached in `folder`."""
    out, key = {}, search_key(cfg, seed)
    for m in sorted(set(LEARNERS.values())):
        scfg = dataclasses.replace(cfg.search, num_answers=m)
        problems = ingraph.search_problems(task, records, m)
        name = f"frozen (m={m})"
        out[name] = cached(os.path.join(folder, f"frozen_m{m}_seed{seed}.json"),
                           functools.partial(frozen_record, policy, task, problems, scfg, key))
        log(f"  seed {seed} {name}: solved {out[name]['solved'][-1]}/{len(records)} "
            f"({out[name]['seconds']:.0f} s)")
        for objective, om in LEARNERS.items():
            if om != m or objective not in rates:
                continue
            for rate in np.atleast_1d(rates[objective]):
                name = f"{objective} (m={m})" + ("" if np.ndim(rates[objective]) == 0
                                                  else f" lr {rate:g}")
                out[name] = cached(
                    os.path.join(folder, f"{objective}_m{m}_lr{rate:g}_seed{seed}.json"),
                    functools.partial(learning_record, policy, task, problems, scfg, objective,
                                      float(rate), key))
                log(f"  seed {seed} {name}: solved {out[name]['solved'][-1]}/{len(records)} "
                    f"({out[name]['seconds']:.0f} s)")
    return out


# -- pilot -------------------------------------------------------------------------------------

def choose_rate(pilot: dict, objective: str, rates) -> float:
    """The pilot's rate for `objective`: most problems solved at the last point (summed over
    the pilot seeds), then the higher mean best fitness, then the smaller rate."""
    def score(rate):
        recs = [runs[f"{objective} (m={LEARNERS[objective]}) lr {rate:g}"]
                for runs in pilot.values()]
        return (sum(r["solved"][-1] for r in recs),
                float(np.mean([r["best_fitness"][-1] for r in recs])), -rate)

    return max(rates, key=score)


# -- statistics --------------------------------------------------------------------------------

def paired(name: str, base: str, runs: dict, field: str = "solved") -> dict:
    """Learning `name` minus frozen `base` on `field` at the last point, paired by search seed:
    the claim (`claims.compare_values`: mean, 95% t half-width, p, verdict) and sign counts."""
    a = [runs[s][name][field][-1] for s in sorted(runs)]
    b = [runs[s][base][field][-1] for s in sorted(runs)]
    d = np.asarray(a, float) - np.asarray(b, float)
    claim = claims.compare_values(f"{name} {field} above {base}'s", a, b, names=(name, base))
    return {**claim, "a": a, "b": b, "positive": int((d > 0).sum()),
            "negative": int((d < 0).sum()), "zero": int((d == 0).sum())}


def summarize(runs: dict, methods: list[str], field: str) -> dict:
    """{method: (mean, 95% t half-width)} of `field` at the last point over the seeds."""
    return {m: claims.t_interval([runs[s][m][field][-1] for s in sorted(runs)])
            for m in methods}


def base_of(method: str) -> str:
    return f"frozen (m={LEARNERS[method.split()[0]]})"


# -- outputs -----------------------------------------------------------------------------------

def plot(path: str, runs: dict, methods: list[str], problems: int) -> None:
    """Three panels against candidates per problem, mean over seeds: solved fraction,
    population diversity, and the learners' token entropy per generation."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from vpo.eval.plots import series_style

    fig = Figure(figsize=(13.0, 3.6))
    axes = fig.subplots(1, 3)
    seeds = sorted(runs)
    for i, m in enumerate(methods):
        style = series_style(i)
        x = np.asarray(runs[seeds[0]][m]["evaluated"])
        solved = np.mean([runs[s][m]["solved"] for s in seeds], 0) / problems
        axes[0].plot(x, solved, label=m, **style)
        axes[1].plot(x, np.mean([runs[s][m]["diversity"] for s in seeds], 0), label=m, **style)
        if "metrics" in runs[seeds[0]][m]:  # generation g's children: candidates x[g]
            ent = np.mean([runs[s][m]["metrics"]["entropy"] for s in seeds], 0)
            axes[2].plot(x[1:], ent, label=m, **style)
    for ax, (ylabel, title) in zip(axes, (
            ("solved fraction", f"{problems} hard codeword problems"),
            ("mean pairwise reward L1", "population diversity"),
            ("nats per token", "token entropy (learning runs)")), strict=True):
        ax.set_xlabel("candidates per problem")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"frozen vs learning island search, mean over {len(seeds)} search seeds")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def fmt(mean_half) -> str:
    mean, half = mean_half
    return f"{mean:.3f}" if np.isnan(half) else f"{mean:.3f} ± {half:.3f}"


def report_text(s: dict, figure: str = "solved.png") -> str:
    """report.md from the summary."""
    d, lines = s["design"], []
    methods, n = s["methods"], s["problems"]
    lines += ["# Frozen vs learning island search at equal budget (exploratory)", "",
              "## Design (fixed before the main run)", "",
              "- **Question**: does one policy-gradient step per generation on the search's own "
              "children (`vpo search --learn`) solve more hard problems than the frozen island "
              "search, with the same warm start, keys and candidate budget?",
              f"- **Policy**: the default `vpo compare` preset's warm start (tiny model from "
              f"scratch, {d['sft_steps']} SFT steps of {d['sft_batch']} rows, m in "
              f"{d['sft_answers']}, half of the rows mutation prompts), `experiments/"
              f"search_learn_compare.py` making it with `vpo.compare.driver.warm_start`.",
              f"- **Problems**: the preset's search problems: the {n} of the {d['pool']} "
              f"problems of split {d['split']} its warm start's sampling finds hardest "
              "(`vpo.compare.search_leg.hard_problems`; here the whole pool).",
              f"- **Search**: {d['islands']} islands x {d['members']} members, {d['parents']} "
              f"parents, {d['children']} children, {d['generations']} generations, temperature "
              f"{d['temperature']}: {d['budget']} candidates per problem. Frozen search in m = 1 "
              "and m = 3; learning with grpo and entropic at m = 1 and vpo at m = 3 (vpo scores "
              "a set of m >= 2 answers; entropic needs >= 3 calls per island and generation, "
              "and C / m = 2 at m = 3), each against the frozen search in its own m.",
              f"- **Learning**: LoRA rank {d['lora_rank']} adapters, Adam with global-norm "
              "clipping 1, no KL, one update per generation from the mean loss over all the "
              "problems' islands (one policy per search seed, shared by its problems).",
              f"- **Unit**: the search seed ({s['seeds']} seeds, 0..{s['seeds'] - 1}; the "
              "compare search stage's keys); every method searches every problem once per seed "
              "with that seed's key, so at learning rate 0 the learning search is the frozen "
              "one bit for bit. **Statistic**: per seed, problems solved (of "
              f"{n}) at {d['budget']} candidates, learning minus frozen (same m); mean ± 95% "
              "Student-t interval, sign counts (+/−/0), one-sided p = max(paired t, exact sign "
              "flip) (`vpo.eval.claims`), verdict at 2.5% per side, Holm over the 3 solved "
              "claims. **Exploratory**: one task, one warm start, one budget, no replication.",
              f"- **Learning rate, from a pilot** on {d['pilot_problems']} problems of split "
              f"{d['pilot_split']} with search seed(s) {d['pilot_seeds']} (neither used in the "
              f"main run): each objective at {', '.join(f'{r:g}' for r in d['rates'])}; rule: "
              "most pilot problems solved at the full budget, then higher mean best fitness, "
              "then the smaller rate. Chosen: "
              + ", ".join(f"{o} {r:g}" for o, r in s["rates"].items()) + ".", ""]
    lines += ["Pilot (problems solved of "
              f"{d['pilot_problems']} at {d['budget']} candidates, mean best fitness):", "",
              "| method | " + " | ".join(f"lr {r:g}" for r in d["rates"]) + " |",
              "|---|" + "---|" * len(d["rates"])]
    for o in s["rates"]:
        cells = [f"{v['solved']} ({v['best_fitness']:.3f})" for v in s["pilot"][o].values()]
        lines.append(f"| {o} (m={LEARNERS[o]}) | " + " | ".join(cells) + " |")
    lines += ["", "Frozen in the pilot: " + ", ".join(
        f"{k} {v['solved']} ({v['best_fitness']:.3f})" for k, v in s["pilot_frozen"].items())
        + ".", ""]
    lines += ["## Results", "",
              f"Per method, over {s['seeds']} search seeds (mean ± 95% t interval) at "
              f"{d['budget']} candidates: problems solved of {n}, mean best fitness (w*ᵀr of the "
              "best candidate, mean over problems), final population diversity; the learners' "
              "token entropy on generation 1's and generation "
              f"{d['generations']}'s children (generation 1 samples from the warm start, so its "
              "entropy is the frozen policy's on those calls).", "",
              "| method | solved | best fitness | diversity | entropy gen 1 | entropy last | "
              "s / run |", "|---|---|---|---|---|---|---|"]
    for m in methods:
        r = s["table"][m]
        ent = (f"{fmt(r['entropy_first'])} | {fmt(r['entropy_last'])}" if "entropy_first" in r
               else " | ")
        lines.append(f"| {m} | {fmt(r['solved'])} | {fmt(r['best_fitness'])} | "
                     f"{fmt(r['diversity'])} | {ent} | {r['seconds']:.0f} |")
    lines += ["", "Paired by search seed, learning − frozen (same m):", "",
              "| comparison | metric | diff (mean ± 95% t) | + / − / 0 | p (side it leans to) | "
              "verdict | Holm p |", "|---|---|---|---|---|---|---|"]
    for c in s["claims"]:
        holm = f"{c['holm_p']:.3g}" if "holm_p" in c else "—"
        verdict = c.get("family_verdict", DESCRIPTIVE[c["verdict"]])
        p = min(c["p"], c["p_other"])
        lines.append(f"| {c['name']} − {c['base']} | {c['field']} | "
                     f"{fmt((c['diff'], c['half_width']))} | {c['positive']} / {c['negative']} "
                     f"/ {c['zero']} | {p:.3g} | {verdict} | {holm} |")
    lines += ["", "Problems solved per seed at the full budget:", "",
              "| method | " + " | ".join(f"s{k}" for k in range(s["seeds"])) + " |",
              "|---|" + "---|" * s["seeds"]]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(str(v) for v in s["per_seed"][m]) + " |")
    lines += ["", "Solved against budget (mean over seeds, problems of "
              f"{n}) at " + ", ".join(str(b) for b in s["budget_points"]) + " candidates:", "",
              "| method | " + " | ".join(str(b) for b in s["budget_points"]) + " |",
              "|---|" + "---|" * len(s["budget_points"])]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{v:.2f}" for v in s["curve_points"][m]) + " |")
    lines += ["", f"![solved vs budget]({figure})", "", "## Verdicts", ""]
    lines += [f"- {v}" for v in s["verdicts"]]
    lines += ["", "Descriptive, outside the family, these comparisons added to the report after "
              "the main run was seen (final population diversity; the two m = 1 learners "
              "against each other; token entropy over the generations):", ""]
    lines += [f"- {v}" for v in s["descriptive"]]
    lines += ["", "Not shown here: whether vpo learns better or worse than grpo (they search in "
              "different m, against different frozen baselines), any other task, budget or "
              "warm start. The frozen search with this warm start solves "
              f"{s['table']['frozen (m=1)']['solved'][0]:.1f} (m = 1) and "
              f"{s['table']['frozen (m=3)']['solved'][0]:.1f} (m = 3) of 32, below the 10.5 and "
              "11.0 of `docs/default/report.md`'s warm start on the same settings: this warm "
              "start (trained again here, same preset and seed, at a later commit) is another "
              "realisation, whose hardness ranking also reorders the problems (seed 0's frozen "
              "search with the plain policy and with the zero LoRA adapters gave the same "
              "first-solve points).", ""]
    w = s["wall"]
    warm = w["warm_start_made"] if w["warm_cached"] else w["warm_start"]
    lines += ["", "## Cost", "",
              f"Measured wall time: {(w['total'] + (warm if w['warm_cached'] else 0)) / 60:.1f} "
              f"min on 2 CPU cores shared with other jobs (load average {s['load']} during the "
              f"searches): the warm start {warm / 60:.1f} min"
              + (" (made once before the searches' invocation, by the same function, and read "
                 "back from `--out`)" if w["warm_cached"] else "")
              + f", the pilot {w['pilot'] / 60:.1f} min, the main runs {w['main'] / 60:.1f} min "
              f"({w['total'] / 60:.1f} min for the searches' invocation). Every shape is "
              "compiled in the pilot, so the results table's seconds per run are compiled "
              "runs: a learning search of 32 problems costs "
              + ", ".join(f"{m} {ratio:.1f}x" for m, ratio in cost_ratios(s).items())
              + " its frozen search's wall time (measured on a loaded machine).", "",
              "Reproduce: `python experiments/search_learn_compare.py --out "
              "runs/search_learn` (records cached in `--out`).", ""]
    return "\n".join(lines)


def cost_ratios(s: dict) -> dict:
    """{learner: its mean seconds per run over its frozen baseline's} from the summary."""
    return {m: s["table"][m]["seconds"] / s["table"][base_of(m)]["seconds"]
            for m in s["methods"] if not m.startswith("frozen")}


def entropy_change(runs: dict, name: str) -> dict:
    """A learner's token entropy on its last generation's children minus on its first's,
    per seed: mean, 95% t half-width and the seeds where it fell."""
    d = [runs[s][name]["metrics"]["entropy"][-1] - runs[s][name]["metrics"]["entropy"][0]
         for s in sorted(runs)]
    mean, half = claims.t_interval(d)
    return {"name": name, "diff": mean, "half_width": half, "fell": int(np.sum(np.less(d, 0))),
            "n": len(d)}


def descriptive_sentences(rows: list[dict], entropy: list[dict]) -> list[str]:
    """Sentences for the comparisons outside the family: each paired difference with its
    interval, signs and the one-sided p of the side it leans to; each entropy change."""
    out = []
    for c in rows:
        side, p = ("above", c["p"]) if c["diff"] >= 0 else ("below", c["p_other"])
        out.append(f"{c['name']} {c['field']} at the full budget {side} {c['base']}'s: "
                   f"{c['diff']:+.3f} ± {c['half_width']:.3f}, {c['positive']} up / "
                   f"{c['negative']} down / {c['zero']} tied, one-sided p = {p:.3g} "
                   "(descriptive, no correction).")
    for e in entropy:
        out.append(f"{e['name']}'s token entropy, last generation minus first: "
                   f"{e['diff']:+.3f} ± {e['half_width']:.3f} nats, lower in {e['fell']} of "
                   f"{e['n']} seeds (descriptive).")
    return out


def verdict_sentences(claims_list: list[dict]) -> list[str]:
    """One sentence per claim saying what its numbers show."""
    out = []
    for c in claims_list:
        v = c.get("family_verdict", c["verdict"])
        what = {"reproduced": "more", "refuted": "fewer"}.get(v)
        head = (f"**{c['name']}** solves {what} of the hard problems than {c['base']} at equal "
                "budget" if what else
                f"**{c['name']}** vs {c['base']}: no difference in problems solved shown")
        out.append(f"{head} ({c['diff']:+.2f} ± {c['half_width']:.2f} problems over "
                   f"{c['n']} seeds, {c['positive']} seeds up / {c['negative']} down / "
                   f"{c['zero']} tied, p = {c['p']:.3g}, Holm p = {c['holm_p']:.3g}; "
                   f"{v}, exploratory).")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="cache folder (warm start, run records)")
    ap.add_argument("--docs", default="docs/search_learn")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    ap.add_argument("--objectives", default=",".join(LEARNERS))
    args = ap.parse_args()
    t_start = time.perf_counter()
    load = [f"{os.getloadavg()[0]:.1f}"]
    cfg = make_config("default")
    task = compare_data.load_tasks(cfg, with_search=True)
    warm_cached = os.path.isfile(os.path.join(args.out, "warm_seconds.json"))
    t0 = time.perf_counter()
    policy = warm_start(cfg, task, args.out, resume=True, progress=not warm_cached)
    warm = cached(os.path.join(args.out, "warm_seconds.json"),
                  lambda: {"seconds": time.perf_counter() - t0})
    wall = {"warm_start": time.perf_counter() - t0, "warm_start_made": warm["seconds"],
            "warm_cached": warm_cached}
    rates_grid = [float(r) for r in args.rates.split(",")]
    objectives = [o for o in args.objectives.split(",") if o]
    # the pilot: its own problems and seeds, every rate
    t0 = time.perf_counter()
    pilot_records = task.make_problems(PILOT_SPLIT, cfg.search_problems)
    pilot = {seed: run_methods(policy, task, pilot_records, cfg, seed,
                               {o: rates_grid for o in objectives},
                               os.path.join(args.out, "pilot"), print)
             for seed in PILOT_SEEDS}
    rates = {o: choose_rate(pilot, o, rates_grid) for o in objectives}
    wall["pilot"] = time.perf_counter() - t0
    print("pilot's rates: " + ", ".join(f"{o} {r:g}" for o, r in rates.items()))
    # the main run
    t0 = time.perf_counter()
    chosen = cached(os.path.join(args.out, "hard_problems.json"),
                    lambda: search_leg.hard_problems(cfg, task, policy))
    records = search_leg.search_records(cfg, task, chosen)
    runs = {seed: run_methods(policy, task, records, cfg, seed, rates,
                              os.path.join(args.out, "runs"), print)
            for seed in range(args.seeds)}
    wall["main"] = time.perf_counter() - t0
    methods = list(runs[0])
    learners = [m for m in methods if not m.startswith("frozen")]
    family = [c | {"name": m, "base": base_of(m), "field": "solved"} for c, m in zip(
        claims.holm([paired(m, base_of(m), runs) for m in learners]), learners, strict=True)]
    fitness = [paired(m, base_of(m), runs, "best_fitness")
               | {"name": m, "base": base_of(m), "field": "best_fitness"} for m in learners]
    diversity = [paired(m, base_of(m), runs, "diversity")
                 | {"name": m, "base": base_of(m), "field": "diversity"} for m in learners]
    between = [paired(a, b, runs) | {"name": a, "base": b, "field": "solved"}
               for a, b in (("entropic (m=1)", "grpo (m=1)"),) if a in runs[0] and b in runs[0]]
    claim_rows = family + fitness + diversity + between
    entropy = [entropy_change(runs, m) for m in learners]
    table = {}
    for m in methods:
        row = {f: summarize(runs, [m], f)[m] for f in ("solved", "best_fitness", "diversity")}
        row["seconds"] = float(np.mean([runs[s][m]["seconds"] for s in runs]))
        if m in learners:
            row["entropy_first"] = claims.t_interval(
                [runs[s][m]["metrics"]["entropy"][0] for s in runs])
            row["entropy_last"] = claims.t_interval(
                [runs[s][m]["metrics"]["entropy"][-1] for s in runs])
        table[m] = row
    evaluated = runs[0][methods[0]]["evaluated"]
    points = [i for i, e in enumerate(evaluated) if e in (12, 60, 120, 180, 240)]
    os.makedirs(args.docs, exist_ok=True)
    plot(os.path.join(args.docs, "solved.png"), runs, methods, len(records))
    wall["total"] = time.perf_counter() - t_start
    load.append(f"{os.getloadavg()[0]:.1f}")
    # the invocation that ran the searches (a rerun from the cache only rewrites the report)
    wall = cached(os.path.join(args.out, "wall.json"), lambda: {**wall, "load": load})
    load = wall.pop("load")
    sc = cfg.search
    summary = {
        "design": {"sft_steps": cfg.sft_steps, "sft_batch": cfg.sft_batch,
                   "sft_answers": cfg.all_answers, "pool": cfg.search_pool,
                   "split": cfg.search_split_seed, "islands": sc.islands, "members": sc.members,
                   "parents": sc.parents, "children": sc.children,
                   "generations": sc.generations, "temperature": sc.temperature,
                   "budget": evaluated[-1], "lora_rank": LearnConfig().lora_rank,
                   "pilot_split": PILOT_SPLIT, "pilot_seeds": list(PILOT_SEEDS),
                   "pilot_problems": len(pilot_records), "rates": rates_grid},
        "problems": len(records), "hard_problems": chosen, "seeds": args.seeds,
        "methods": methods, "rates": rates,
        "pilot": {o: {f"{r:g}": {"solved": sum(p[f"{o} (m={LEARNERS[o]}) lr {r:g}"]["solved"][-1]
                                               for p in pilot.values()),
                                 "best_fitness": float(np.mean(
                                     [p[f"{o} (m={LEARNERS[o]}) lr {r:g}"]["best_fitness"][-1]
                                      for p in pilot.values()]))}
                      for r in rates_grid} for o in objectives},
        "pilot_frozen": {m: {"solved": sum(p[m]["solved"][-1] for p in pilot.values()),
                             "best_fitness": float(np.mean([p[m]["best_fitness"][-1]
                                                            for p in pilot.values()]))}
                         for m in pilot[PILOT_SEEDS[0]] if m.startswith("frozen")},
        "table": table, "claims": claim_rows,
        "per_seed": {m: [runs[s][m]["solved"][-1] for s in sorted(runs)] for m in methods},
        "budget_points": [evaluated[i] for i in points],
        "curve_points": {m: [float(np.mean([runs[s][m]["solved"][i] for s in runs]))
                             for i in points] for m in methods},
        "curves": {m: {f: np.mean([runs[s][m][f] for s in runs], 0).tolist()
                       for f in ("solved", "best_fitness", "diversity")} for m in methods},
        "entropy_curves": {m: np.mean([runs[s][m]["metrics"]["entropy"] for s in runs],
                                      0).tolist() for m in learners},
        "verdicts": verdict_sentences(family), "entropy_change": entropy,
        "descriptive": descriptive_sentences(diversity + between, entropy),
        "wall": wall, "load": " -> ".join(load)}
    with open(os.path.join(args.docs, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    with open(args.docs.rstrip("/") + ".md", "w", encoding="utf-8") as f:
        folder = os.path.basename(args.docs.rstrip("/"))
        f.write(report_text(summary, figure=f"{folder}/solved.png"))
    for v in summary["verdicts"]:
        print(v)
    print(f"WALL of the invocation that ran the searches {wall['total']:.0f} s "
          f"({wall['total'] / 60:.1f} min): warm start {wall['warm_start']:.0f} s, pilot "
          f"{wall['pilot']:.0f} s, main {wall['main']:.0f} s")


if __name__ == "__main__":
    main()
