"""The `vpo compare` report's text: report.md as a pure function of summary.json (`render`),
every verdict recomputed from the per-seed values it holds (`vpo.compare.numbers`), so a
committed report can be re-rendered and compared (tests/project/test_committed_reports.py). Its
first lines state the design: the pre-registered primary claims (the config's `primary`), the
unit, the test and what the seed count can decide (`design_text`, also printed before a run
starts); every other family is labelled exploratory, and each family says how it was corrected.
"""

# size: one job, report.md's text: each section of the report is one short function here.

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import search_report, temperature_report, verdicts
from vpo.compare.config import ARMS, CompareConfig
from vpo.compare.numbers import CHECKPOINTS, FAMILIES, PRIMARY, TRENDS, law_table, verdict_families
from vpo.config import from_dict
from vpo.eval import claims, entropy_law

PROBE_KEYS = ("valid", "improve", "copy", "distinct", "solved", "child_fitness", "entropy")


def design_text(cfg: CompareConfig) -> str:
    """What the design can decide, before it runs (the driver prints it first; the report's
    design lines say the same): the primary claims, unit, test, the smallest p the seed count
    allows and whether it can decide, else how many seeds it would need (`claims.design`)."""
    keys = verdicts.primary_keys(cfg.primary)
    per_problem = [k for k in keys if verdicts.per_problem(k)]
    d = claims.design(cfg.num_seeds, len(keys) - len(per_problem))
    missing = sorted({arm for k in keys for arm in k.split(":")[0].split("-")
                      if arm != verdicts.WARM and arm not in cfg.arm_names})
    every = ("claimed for every seed (an intersection-union test: the problems decide each "
             "seed, so a few seeds can decide them)")
    unit = ("unit the held-out problem within each seed, each " + every
            if len(per_problem) == len(keys) else "unit the training seed" + (
                f"; {len(per_problem)} of them per problem within each seed, {every}"
                if per_problem else ""))
    text = (f"Primary claims ({len(keys)}, Holm over them, exact one-sided sign-flip at "
            f"{claims.LEVEL:g}, {unit}): "
            + "; ".join(verdicts.primary_text(k, cfg.eval_budget) for k in keys) + ". "
            + ("The seed-level claims (when the per-problem ones rank first under Holm): "
               if per_problem and len(per_problem) < len(keys) else "")
            + (claims.design_text(d)[0].upper() + claims.design_text(d)[1:] + "."
               if len(per_problem) < len(keys) else ""))
    if missing:
        text += (f" Arms {', '.join(missing)} are not in arms={cfg.arms}: the claims naming "
                 "them cannot be measured.")
    return text


def fmt(values) -> str:
    """Mean ± 95% t half-width; the mean alone when fewer than `claims.MIN_UNITS` values back
    it (an interval from one degree of freedom says nothing)."""
    mean, hw = claims.interval(values)
    return f"{mean:.3f}" if math.isnan(hw) else f"{mean:.3f} ± {hw:.3f}"


def _per_search(searches, row: str) -> np.ndarray:
    """Solved count per search seed, averaged over the row's policy seeds ([search seed])."""
    return np.mean([np.sum(r["solved_SP"], -1) for r in searches["rows"][row]], axis=0)


def correction_text(family: list[dict[str, Any]], what: str) -> str:
    """The sentence a printed family states its correction in: Holm over its C claims at the
    one-sided level in both directions, which reproduced or refuted claims survive, and when
    the seeds cannot reach it at all (smallest adjusted p C·2^-n, n the most paired units of
    any claim in the family)."""
    C = len(family)
    won = [c for c in family if c["verdict"] in (claims.REPRODUCED, claims.REFUTED)]
    lost = [c["claim"] for c in won if not c["survives_holm"]]
    text = (f"Multiplicity: Holm's step-down correction (Holm 1979) over the {C} {what}, one "
            f"family, in both directions (each claim's p on the side its data lean to), at the "
            f"one-sided {100 * claims.LEVEL:g}% level of each verdict; the bold verdict is the "
            "corrected one: ")
    if not won:
        text += "no claim is reproduced or refuted."
    else:
        text += (f"{len(won) - len(lost)} of the {len(won)} reproduced or refuted claims survive "
                 "it" + (": all do." if not lost else
                         "; these do not: " + "; ".join(lost) + "."))
    return text


def floor_text(family: list[dict[str, Any]], what: str) -> str:
    """The sentence a family that cannot decide opens with ("" when it can): with C claims and
    at most n paired units per claim, the smallest Holm-adjusted p is C · 2^-n (C times the
    smallest p of its claims' tests)."""
    C = len(family)
    if not C:
        return ""
    floor = C * min(c.get("smallest_p", claims.smallest_p(c["n"])) for c in family)
    if floor < claims.LEVEL:
        return ""
    n = max(c["n"] for c in family)
    return (f"**Not testable as a family**: {C} {what} with at most {n} paired units each: the "
            f"smallest possible Holm-adjusted p is {C} × 2^-{n} = {min(1.0, floor):.3g} >= "
            f"{claims.LEVEL:g}, so no verdict below can survive the correction; each line is a "
            "description.")


def render(summary: dict[str, Any]) -> str:
    """report.md from a summary.json (as `write_report` stores it, or an older one): a pure
    function of the summary, every verdict recomputed with this code from the per-seed values it
    holds (headline, search, probe, entropy-law trajectories, per-step training metrics when
    kept). A summary without a `primary` in its config predates pre-registration: its primary
    claims are the current default's and the design lines say so."""
    cfg = from_dict(CompareConfig, summary["config"])
    head, searches, probes = summary["headline"], summary.get("search"), summary.get("probe")
    law = {a: t["trajectories"] for a, t in (summary.get("entropy_law") or {}).items()}
    train = summary.get("train")
    families = verdict_families(cfg, head, summary["eval"]["ks"], law, searches, probes, train)
    static = summary.get("static")
    if static is None:
        static = [arm for arm, rs in (train or {}).items()
                  if all(row.get("grad_norm", 1.0) == 0.0 for r in rs for row in r["metrics"])]
    return report_text(cfg, summary["command"], summary["wall_s"], head, families,
                       law_table(law), searches, probes, summary.get("load", ""), static=static,
                       preregistered="primary" in summary["config"], gate=summary.get("gate"),
                       data=summary.get("data"), per_answer_reward=_per_answer(train),
                       temperatures=summary.get("temperature"))


def _verdict_line(c: dict[str, Any], label: str = "exploratory") -> str:
    """One claim: its family-wise verdict in bold (the per-claim verdict when it has no family),
    then the label, the note, the claim, its evidence and the Holm outcome."""
    shown = c.get("family_verdict", c["verdict"])
    note = "; ".join(x for x in (label, c.get("note", "")) if x)
    note = f" ({note})" if note else ""
    decided = c["verdict"] in (claims.REPRODUCED, claims.REFUTED)
    holm = "" if "holm_p" not in c else (
        f" Holm-adjusted p = {c['holm_p']:.3g} over {c['family_size']} claims"
        + ("; survives." if c["survives_holm"] else
           f"; {c['verdict']} alone, it does not survive." if decided else "."))
    return f"- **{shown}**{note}: {c['claim']}. {c['evidence']}.{holm}"


def _family_lines(family: list[dict[str, Any]], what: str, label: str = "exploratory"
                  ) -> list[str]:
    """A family's verdict lines and the paragraph stating its correction, after the sentence
    saying it cannot decide when its Holm floor is above the level (`floor_text`)."""
    first = floor_text(family, what)
    return (([first, ""] if first else []) + [_verdict_line(c, label) for c in family]
            + ["", correction_text(family, what)])


def _design_lines(cfg, primary: list[dict[str, Any]], preregistered: bool) -> list[str]:
    """The report's first lines: primary claims, unit, test, what the seeds can decide."""
    d = claims.design(cfg.num_seeds, len(primary))
    text = claims.design_text(d)
    lines = ["## Design", "",
             f"- **Primary claims** ({len(primary)}, from the config's `primary`"
             + ("" if preregistered else
                "; this run predates pre-registration, so they are the current default's, "
                "named after the run") + "): "
             + "; ".join(f"`{c['key']}`: {c['claim']}" for c in primary) + ".",
             f"- **Unit**: the training seed ({cfg.num_seeds} paired seeds, {cfg.seeds}; rows "
             "matched by seed id).",
             f"- **Test**: exact one-sided sign-flip randomization test at {claims.LEVEL:g} (p the "
             "larger of it and the paired t-test's), Holm over the primary family in both "
             "directions.",
             f"- **What the seeds can decide**: {text}.",
             "- Every other comparison in this report is **exploratory**: its own Holm family, "
             "labelled so, not a test of the design."]
    if cfg.design_notes:
        lines.append(f"- **Changes after a look at results** (pre-registration on the record): "
                     f"{cfg.design_notes}")
    return lines + [""]


def _gate_lines(cfg, gate: dict[str, Any] | None) -> list[str]:
    """The pilot gate's numbers (the warm start before RL) and what they say; [] for a summary
    written before the gate existed."""
    if not gate:
        return []
    N = cfg.eval_budget
    k = gate.get("k", {})  # the k the claims name (a gate recorded before them: N)
    kp, kc = k.get("pass", N), k.get("cover", N)
    failed = gate.get("failed") or []
    verdict = ("every check passed" if not failed else
               ("failed and enforced: " if gate.get("enforced") else "failed (not enforced): ")
               + "; ".join(failed))
    lines = [f"**Pilot gate** (the warm start before RL, {gate['problems']} held-out problems, "
             f"{N} candidates each): pass@1 {gate['pass@1']:.3f}, pass@{N} "
             f"{gate[f'pass@{N}']:.3f}, best@{N} {gate[f'best@{N}']:.3f}; "
             f"{gate['group_spread']:.0%} of step-0 groups (G = {gate['G']}) have unequal "
             f"rewards. Headroom band pass@{kp} in [{cfg.gate_pass_min:g}, "
             f"{cfg.gate_pass_max:g}], signal at least {cfg.spread_min:.0%}"
             + (f" (one learning group per step: 1/{cfg.train.batch_size})"
                if cfg.gate_spread_min is None else "") + f": {verdict}.", ""]
    if "hit_rates" in gate:
        rates = ", ".join(f"{k} {v:.3f}" for k, v in gate["hit_rates"].items())
        lines += [f"**The cover signal** (the same step-0 candidates): hit rates {rates} (each at "
                  f"least {cfg.gate_hit_min:g}); a hit in {gate['hit_groups']:.0%} of the groups "
                  f"(at least {cfg.gate_hit_groups_min:.0%}); warm-start cover@{kc} "
                  f"{gate[f'cover@{kc}']:.3f} (band [{cfg.gate_cover_min:g}, "
                  f"{cfg.gate_cover_max:g}]).", ""]
    cal = gate.get("search")
    if cal:
        lines += [f"**Search calibration** (before RL, the warm start's island search in its "
                  f"stronger mode m={cal['mode']}, {cal['searches']} searches on each of the "
                  f"{cal['problems']} search problems with calibration keys of their own): "
                  f"solves {cal['fraction']:.1%} at {cal['budget']} candidates, the largest "
                  f"budget at which it solves at most {cal['band'][1]:.0%}; band "
                  f"[{cal['band'][0]:.0%}, {cal['band'][1]:.0%}]: "
                  + ("in band." if cal["in_band"] else "OUT of band."), ""]
    pilot = gate.get("pilot")
    if pilot:  # the first seed of every arm, before the other seeds trained
        div = ", ".join(f"{a} {v:.3f}" for a, v in pilot["diversity"].items())
        above = "; ".join(f"{k}: {'above' if ok else 'NOT above'}"
                          for k, ok in pilot["above"].items())
        lines += [f"**Diversity pilot** (seed {pilot['seed']}, mean training diversity over the "
                  f"first {pilot['steps']} steps, one seed: a description, not a test): {div}"
                  + (f" ({above})" if above else "") + ".", ""]
    return lines


def report_text(cfg, command, wall, head, families, laws, searches, probes, load,
                static: list[str] | None = None, preregistered: bool = True,
                gate: dict[str, Any] | None = None,
                data: dict[str, Any] | None = None, per_answer_reward: bool = False,
                temperatures: dict[str, Any] | None = None) -> str:
    """report.md: `families` as from `verdict_families` (each printed with its correction),
    the design lines first; `data`: your data's record (`vpo.compare.data.describe`). Each
    section is one function below, in the report's order."""
    lines = [f"# vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}", "",
             f"`{command}`", ""]
    lines += _design_lines(cfg, families[PRIMARY[0]], preregistered)
    lines += _gate_lines(cfg, gate)
    lines += _static_lines(static)
    lines += _setup_lines(cfg, head, data)
    lines += _headline_lines(cfg, head, families, searches)
    lines += _claims_lines(families)
    lines += _warm_start_lines(families, searches)
    if searches is not None:
        lines += _search_text(cfg, searches, head, families["search_vs_best_of_n"],
                              families.get(CHECKPOINTS[0], []))
    if families.get("budget") or families.get("bridge"):
        lines += _curves_text(cfg, searches, head, families)
    if temperatures is not None and searches is not None:
        lines += temperature_report.lines(temperatures, searches)
    if probes:
        lines += _probe_text(cfg, head, probes, families["remedies"])
    lines += _trend_lines(families, per_answer_reward)
    lines += _law_lines(cfg, laws)
    lines += _figure_lines(laws, searches, temperatures is not None)
    lines += _wall_lines(wall, load)
    return "\n".join(lines)


def _static_lines(static: list[str] | None) -> list[str]:
    """The warning that arms with a zero gradient at every step are their warm start."""
    if not static:
        return []
    return [f"**No learning signal in {', '.join(static)}**: the gradient was zero at "
            "every step of every seed (each group's rewards were equal), so "
            + ("these arms are" if len(static) > 1 else "this arm is") + " the warm start "
            "itself and every verdict involving them compares a policy with its own "
            "starting point; train longer or on a task where the warm start earns some "
            "reward (a larger preset).", ""]


def _setup_lines(cfg, head, data: dict[str, Any] | None) -> list[str]:
    """The policy, warm start, RL settings and arms, your data, and how evaluation is done."""
    N = cfg.eval_budget
    seeds = max(len(h["seeds"]) for h in head.values())
    sft = f"SFT, {cfg.sft_steps} steps on a mixture of m in {cfg.all_answers} prompts"
    start = (f"{cfg.init}, with {sft} when fewer than {cfg.parse_floor:.0%} of its answers "
             "parsed" if cfg.init else sft)
    lora = f", LoRA rank {cfg.lora_rank}" if cfg.lora_rank else ""
    return [f"Policy `{cfg.init or cfg.model}`{lora}; one warm start "
            f"for every arm ({start}); "
            f"{cfg.train.steps} RL steps x {cfg.train.batch_size} prompts x G = "
            f"{cfg.sampler.num_samples} samples, lr {cfg.train.learning_rate:g}, seeds "
            f"{cfg.seeds}. Arms: " + "; ".join(_arm_text(a, cfg) for a in cfg.arm_names) + ".",
            "", *compare_data.report_lines(data, cfg),
            f"Evaluation: {cfg.eval_problems} held-out problems (seed {cfg.eval_seed}), N = {N} "
            f"candidates per problem for every policy (N/m generations of m answers) at "
            f"temperature {cfg.eval_temperature:g}; every parsed answer is a scored candidate "
            "for every policy (repeats inside a generation are not zeroed). Seed i of every "
            "row (the warm-start rows too) is evaluated with the same key, so rows pair by "
            "seed. Cells: mean "
            + ("± half-width of a 95% Student-t interval over seeds" if seeds > 1 else
               "(one seed)")
            + f"; a cell backed by fewer than {claims.MIN_UNITS} independent units shows the "
            "mean alone.", ""]


def _headline_metrics(cfg, head, families) -> list[str]:
    """The headline table's columns: the usual metrics, a primary claim's own k, those present."""
    N = cfg.eval_budget
    metrics = ["best@1", "pass@1", f"best@{N}", f"pass@{N}", f"cover@{N}", "diversity", "distinct",
               "valid_fraction", "entropy", "train entropy", "train diversity", "search solved"]
    claimed = [verdicts.metric_key(c["key"], N) for c in families[PRIMARY[0]] if "key" in c]
    metrics[2:2] = [k for k in dict.fromkeys(claimed) if k not in metrics]  # a claim's own k
    return [k for k in metrics if any(k in h["values"] for h in head.values())]


def _headline_lines(cfg, head, families, searches) -> list[str]:
    """The headline table, a row per policy, and what each of its columns means."""
    metrics = _headline_metrics(cfg, head, families)
    lines = ["| policy | m | seeds | " + " | ".join(metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for name, h in head.items():
        cells = [fmt(h["values"][k]) if k in h["values"] else "" for k in metrics]
        if (name.startswith("sft") and searches is not None and "search solved" in metrics
                and not searches.get("per_seed_keys")):
            # one policy searched with the shared keys: its interval is over the searches
            cells[metrics.index("search solved")] = fmt(_per_search(searches, name))
        lines.append(f"| {name} | {h['m']} | {len(h['seeds'])} | " + " | ".join(cells) + " |")
    return lines + ["", "best@k: mean over problems of the best w*ᵀr among k candidates (partial "
                    "credit); pass@k, beside it: unbiased probability that k candidates contain a "
                    "solution (solving), so a best@k gain without a pass@k gain is closer "
                    "answers, not more problems solved; diversity: mean "
                    "pairwise L1 distance of valid candidates' reward vectors; distinct: distinct "
                    "valid answers; valid_fraction: candidates that parse; train entropy / "
                    "diversity: last 20% of training steps; search solved: hard problems solved, "
                    f"mean over {cfg.search_seeds} searches (warm-start rows: interval over those "
                    "searches, one policy). The warm-start rows are the one SFT policy answering "
                    "in each m.", ""]


def _claims_lines(families) -> list[str]:
    """How a claim is judged, then the primary claims and the papers' claims."""
    level = f"{100 * claims.LEVEL:g}%"
    lines = ["## Claims", "",
             "Each claim is a paired difference over seeds, rows matched by seed id (same warm "
             "start, same problems, same evaluation keys), judged one-sided in the claimed "
             f"direction at {level} (each tail of a 95% interval) with p the larger of the "
             "paired Student-t test's and the exact sign-flip randomization test's over the "
             "seeds (Fisher 1935), so p is never below 2^-n with n seeds: **reproduced** "
             f"when p < {level} in the claimed direction, **refuted** when p < {level} the "
             "other way, **inconclusive** otherwise (ties, saturated values, and fewer than "
             f"{claims.min_seeds()} seeds, where even 2^-n is not below {level}). Each family "
             "is then Holm-corrected in both directions and the bold verdict is the corrected "
             "one. Token-entropy and training-diversity claims compare arms with the same m "
             "only.", "",
             "### Primary claims", ""]
    lines += _family_lines(families[PRIMARY[0]], PRIMARY[1], label="primary")
    lines += ["", "### The papers' claims (exploratory)", ""]
    if families["claims"]:
        return lines + _family_lines(families["claims"], FAMILIES[0][1])
    return lines + ["(no claim applies to these arms)"]


def _warm_start_lines(families, searches) -> list[str]:
    """Each RL arm against its warm start (and the warm start's search), when compared."""
    warm = families["against_warm_start"]
    if not warm:
        return []
    lines = ["", "## RL against its warm start (exploratory)", "",
             "Each arm against the warm start's stronger mode on the metric (the better of "
             "its single-answer and m-answer pools, named in each line), paired by seed id "
             "(the warm start evaluated, and searched, with each seed's keys)."
             + ("" if searches is None or searches.get("per_seed_keys") else
                " This run searched the warm start with one set of keys for every seed, "
                "so its search is not compared here."), ""]
    lines += _family_lines(warm, FAMILIES[1][1])
    if families.get("warm_search"):
        lines += [""] + _family_lines(families["warm_search"], FAMILIES[6][1])
    return lines


def _trend_lines(families, per_answer_reward: bool) -> list[str]:
    """Whether each per-step training metric rose over training, when trends were kept."""
    if not families.get(TRENDS[0]):
        return []
    lines = ["", "## Trends over training (exploratory)", "",
             "Does a per-step training metric (reward: w*ᵀr "
             + ("per answer slot, the mean over the m answers" if per_answer_reward else
                "summed over the m answers") + "; "
             "token entropy; reward-space diversity of the group) rise over training? Per "
             "run, Kendall's τ against the step over every logged step; across the seeds, "
             "the exact sign test of the τ's signs (the runs are the units, so it cannot "
             "go below 2^-n with n seeds). **reproduced**: rose; **refuted**: fell.", ""]
    return lines + _family_lines(families[TRENDS[0]], TRENDS[1])


def _law_lines(cfg, laws) -> list[str]:
    """The entropy law's fits on held-out score against the three simpler models, per arm."""
    if not laws:
        return []
    lines = ["", "## Entropy law on held-out score (exploratory)", "",
             f"Per run, R = held-out score (best@1 on {cfg.law_problems} problems of seed "
             f"{cfg.eval_seed + 1}, {cfg.law_budget} candidates each, T = "
             f"{cfg.eval_temperature:g}, same key at every point) at step 0 and at "
             f"{cfg.law_points} checkpoints, H = training token entropy of the 10 steps "
             "before each. Four models are fitted on the early half of each seed's points "
             "and scored by RMSE on the later half; a, b and R² are the law's fit on all "
             "points. Mean ± 95% interval over seeds.", "",
             "| arm | a | b | R² | RMSE law | RMSE linear in H | RMSE trend in steps | "
             "RMSE constant |", "|---|---|---|---|---|---|---|---|"]
    for arm, t in laws.items():
        lines.append(f"| {arm} | {fmt(t['a'])} | {fmt(t['b'])} | {fmt(t['r2'])} | "
                     + " | ".join(fmt(t["rmse"][k]) for k in entropy_law.MODELS) + " |")
    return lines


def _figure_lines(laws, searches, temperatures: bool = False) -> list[str]:
    """The report's PNGs: evaluation, training, the entropy law, the search and the temperature
    sweep, as present."""
    lines = ["", "## Figures", "", "![best@k](best_at_k.png) ![pass@k](pass_at_k.png)", "",
             "![training](training.png)", ""]
    if laws:
        lines += ["![entropy law](entropy_law.png)", ""]
    if searches and search_report.has_curves(searches):
        lines += ["![budget curves](budget_curves.png)", "", "![bridge](bridge.png)", ""]
    elif searches:
        lines += ["![search](search_solved.png)", ""]
    if searches and temperatures:
        lines += [f"![temperature]({temperature_report.FIGURE})", ""]
    return lines


def _wall_lines(wall: dict[str, float], load: str) -> list[str]:
    """Seconds per stage, the machine's load, and where the per-run files are."""
    lines = ["## Wall time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in wall.items()]
    if load:
        lines += ["", f"Machine: {load}"]
    return lines + ["", "Per-run metrics: `arms/<arm>/seed<k>/metrics.jsonl` (and TensorBoard "
                    "under `tb/`); the warm start: `sft/`; all numbers: `summary.json`.", ""]


def _search_text(cfg, searches, head, bon: list[dict[str, Any]],
                 checkpoints: list[dict[str, Any]] = ()) -> list[str]:
    P, S = len(searches["problems"]), searches["seeds"]
    chosen = (f"The {P} problems of split {searches['split_seed']} (of {searches['pool']}, "
              "which no arm is trained, evaluated or chosen on) that the warm start found "
              f"hardest (solved fraction {np.mean(searches['warm_start_solved']):.2f} at "
              f"pass@{cfg.eval_budget} over its m modes, pool mean "
              f"{searches['pool_solved_mean']:.2f}). ")
    if searches.get("per_seed_keys"):
        how = (f"Each policy is the mutation operator of {S} island search"
               f"{'es' if S > 1 else ''} per problem and training seed, up to "
               f"{searches['max_budget']} candidates each; seed i of "
               "every row searches with the same keys (the warm start's rows too, so its "
               "searches vary as the arms' do). Problems and budget were fixed before RL; the "
               f"claims read the solved count at the calibrated budget, {searches['budget']} "
               "candidates. Because the problems are chosen as hard for the warm start, warm "
               "start vs RL comparisons on them lean against the warm start; arm vs arm "
               "comparisons do not.")
    else:
        how = (f"Each policy is the mutation operator of {S} island searches per problem, "
               f"{searches['budget']} candidates each, the same search keys for every policy. "
               "Because the problems are chosen as hard for the warm start, warm start vs RL "
               "comparisons on them lean against the warm start; arm vs arm comparisons do "
               "not.")
    lines = ["", "## Search", "", chosen + how, "",
             "Solve matrix: the fraction of (policy seed, search) runs that solve each problem"
             + (" at the calibrated budget." if searches.get("per_seed_keys") else "."),
             "", "| policy | " + " | ".join(f"p{i}" for i in searches["problems"]) + " | solved "
             "(mean ± 95%) |", "|---|" + "---|" * (P + 1)]
    for name, rows in searches["rows"].items():
        rate = np.mean([np.mean(r["solved_SP"], axis=0) for r in rows], axis=0)
        one_key_set = name.startswith("sft") and not searches.get("per_seed_keys")
        per = (_per_search(searches, name) if one_key_set
               else head[name]["values"]["search solved"])
        lines.append(f"| {name} | " + " | ".join(f"{x:.2f}" for x in rate) + f" | {fmt(per)} |")
    arms = [a for a in searches["rows"] if not a.startswith("sft")]
    only = []
    for a in arms:
        for b in arms:
            if a < b:
                sa = np.any([np.any(r["solved_SP"], axis=0) for r in searches["rows"][a]], 0)
                sb = np.any([np.any(r["solved_SP"], axis=0) for r in searches["rows"][b]], 0)
                only.append(f"{a} {int(np.sum(sa & ~sb))} vs {b} {int(np.sum(sb & ~sa))}")
    if only:
        lines += ["", "Problems solved in some run of one arm and in none of the other's: "
                  + "; ".join(only) + "."]
    if bon:
        lines += ["", "Island search against best-of-N (independent samples from the plain "
                  "prompt) with the same policy, budget and keys: problems solved, mean over "
                  "searches, paired by training seed (does the search add anything to "
                  "sampling?).", ""]
        lines += _family_lines(bon, FAMILIES[2][1])
    if checkpoints:
        lines += ["", "The same for the warm start: one checkpoint per m, so these pair over its "
                  "searches (the shared search keys) and are statements about that checkpoint, "
                  "not about training; a family of their own.", ""]
        lines += _family_lines(checkpoints, CHECKPOINTS[1])
    return lines


def _curves_text(cfg, searches, head, families) -> list[str]:
    """Budget curves (table, gap claims) and the bridge from training to search, opened by the
    paragraph that answers the comparison's question with its numbers."""
    P = len(searches["problems"])
    lines = ["", "## Does search track what training keeps? (the question)", "",
             _answer(cfg, searches, head, families), "",
             "### Budget curves", "",
             f"Solved fraction of the {P} search problems against the candidate budget, for "
             "every search method and policy (mean over training seeds and their searches); "
             "every method spends the same candidates at each point, with the same keys.", ""]
    lines += search_report.budget_table(searches)
    lines += ["", "### Solve sets", "", "The problems each policy's island search solved at "
              "the calibrated budget in any of its training seeds, compared both ways (a "
              "count of solved problems can rise by a higher rate on shared problems or by "
              "problems the other never solves):", ""]
    lines += search_report.solve_sets(searches)
    if families.get("budget"):
        lines += ["", "Does the VPO - GRPO gap grow with the budget? Per seed, the gap at the "
                  "largest budget minus the gap at the smallest, and the gap at the largest "
                  "(both must hold):", ""]
        lines += _family_lines(families["budget"], FAMILIES[4][1])
    if families.get("bridge"):
        lines += ["", "### The bridge: search against what training kept", "",
                  "Each RL run (arm x seed) is a unit: its end-of-training token entropy and "
                  "reward-space diversity (mean of the last 20% of steps) against its search "
                  "solve count at the calibrated budget. Across arms the runs differ in "
                  "objective (and m) too, so the pooled line is descriptive; the within-arm "
                  "lines hold the objective fixed, the stratified line (arms as blocks, runs "
                  "exchanged only inside their arm) is the direct test, and its version given "
                  "held-out pass@k tells diversity apart from competence.", ""]
        lines += _family_lines(families["bridge"], FAMILIES[5][1])
    return lines


def _answer(cfg, searches, head, families) -> str:
    """One paragraph with numbers: search success against training entropy / diversity across
    runs, and VPO's search against GRPO's and the warm start's."""
    P, B = len(searches["problems"]), searches["budget"]
    parts = []
    pooled = [c for c in families.get("bridge", []) if c["claim"].startswith("across")]
    for c in pooled:
        what = "entropy" if "entropy" in c["claim"] else "diversity"
        parts.append(f"with end-of-training {what} ρ = {c['rho']:+.2f} "
                     f"(p {c['p']:.2g}, {c['family_verdict']} after Holm)")
    text = ""
    if pooled:
        text += (f"Across the {pooled[0]['n']} RL runs, the search solve rate's rank "
                 "correlation " + " and ".join(parts) + ". ")
    means = {r: float(np.mean(head[r]["values"]["search solved"])) for r in head
             if "search solved" in head[r]["values"]}
    if means:
        text += (f"At the calibrated budget ({B} candidates per problem), the island search "
                 "solves on average " + ", ".join(f"{v:.1f} of {P} with {r}"
                                                  for r, v in means.items()) + ". ")
    curves = search_report.budget_curves(searches).get("search", {})
    if curves:
        rise = {r: c[1][-1] - c[1][0] for r, c in curves.items()}
        budgets = next(iter(curves.values()))[0]
        text += (f"From {budgets[0]} to {budgets[-1]} candidates its solved fraction rises by "
                 + ", ".join(f"{v:+.3f} ({r})" for r, v in rise.items()) + ". ")
    prim = [c for c in families.get(PRIMARY[0], []) if c.get("key", "").endswith(":search")]
    for c in prim:
        text += (f"Primary claim `{c['key']}`: **{c['family_verdict']}** ({c['evidence']}).")
    return text.strip()


def _per_answer(train) -> bool:
    """Whether the runs logged `reward` per answer slot (with `set_reward` beside it for m > 1)
    rather than as the set's sum, as runs before that scale did: told by any run's first row
    holding `set_reward`."""
    return any("set_reward" in row for rs in (train or {}).values() for r in rs
               for row in r["metrics"][:1])


def _probe_text(cfg, head, probes, fixes) -> list[str]:
    lines = ["", "## The policy as mutation operator", "",
             "`policy_eval.mutation_probe` on the search's hard problems: the task's weaker "
             "parents of good answers in the search's mutation prompt, "
             f"{cfg.probe_samples} generations per problem, the children scored as the search "
             "scores them. Fractions of "
             "child slots: valid (well-formed, new in its generation), improve (beats the best "
             "parent), copy (repeats a parent), distinct (distinct valid children / slots), solved "
             "(solves the problem); "
             "child fitness: mean w*ᵀr per slot. The plain-prompt valid fraction from the "
             "evaluation, for comparison. Mean ± 95% interval over seeds (the warm start: "
             "one policy, one measurement).",
             "", "| policy | " + " | ".join(PROBE_KEYS) + " | valid (plain prompt) |",
             "|---|" + "---|" * (len(PROBE_KEYS) + 1)]
    for name, rows in probes.items():
        v = head[name]["values"]
        one = name.startswith("sft")  # one policy, one key: a single measurement
        lines.append(f"| {name} | " + " | ".join(f"{rows[0][k]:.3f}" if one else
                                                 fmt([r[k] for r in rows]) for k in PROBE_KEYS)
                     + f" | {fmt(v['valid_fraction'])} |")
    if fixes:
        lines += ["", "Mutation prompts in RL (`train.mutation_fraction`), paired by seed id:",
                  ""]
        lines += _family_lines(fixes, FAMILIES[3][1])
    return lines


def _arm_text(arm: str, cfg: CompareConfig) -> str:
    m = cfg.arm_answers(arm)
    text = {"grpo": "**grpo** = GRPO, 1 answer per generation, scalar reward w*ᵀr (the paper's "
                    "GRPO baseline)",
            "maxk": "**maxk** = Max@K (m=1; k = max(2, G/2), std-normalised)",
            "rw_grpo": "**rw_grpo** = random-weight GRPO (m=1; a fresh Dirichlet weight, GRPO "
                       "on wᵀr)",
            "passk": "**passk** = pass@k training (m=1; analytic advantages)",
            "multi_rlvr": f"**multi_rlvr** = GRPO on {m} answers per generation with the summed "
                          "scalar Σ_j w*ᵀr_j (Multi-RLVR)",
            "vpo": f"**vpo** = VPO, {m} answers per generation, E_w~Dir({cfg.objective.alpha:g})"
                   f"[max_j wᵀr_j] with K = {cfg.objective.num_weights}",
            "clip_cov": "**clip_cov** = GRPO (m=1) with Clip-Cov",
            "kl_cov": "**kl_cov** = GRPO (m=1) with KL-Cov",
            "gppo": "**gppo** = GRPO (m=1) with GPPO's gradient-preserving clipping",
            "entropy_mask": "**entropy_mask** = GRPO (m=1), gradient on the top-20% entropy "
                            "tokens only"}
    if arm.endswith("_mut"):
        base = arm.removesuffix("_mut")
        return (f"**{arm}** = {base} with mutation prompts in RL (train.mutation_fraction = "
                f"{_mut_fraction(arm):g})")
    return text[arm]


def _mut_fraction(arm: str) -> float:

    return ARMS[arm].train.get("mutation_fraction", 0.0)
