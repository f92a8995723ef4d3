"""Table 3 at --scale real: the base row's seed-to-seed noise, and each row judged against it.

The band of a column (dev perplexity, dev BLEU) is BANDS standard deviations (n - 1 in the
denominator) of the base row's seeds. A row's difference is its value (the mean of its seeds)
minus the base row's mean; its class, for each column on its own:

    agrees        the paper's sign, beyond the band
    within noise  inside the band (|difference| <= band)
    disagrees     the other sign, beyond the band

A row the paper reports as equal to base (|dBLEU| <= 0.1, |dPPL| <= 0.02: `EQUAL`) agrees
inside the band and disagrees beyond it. A row whose first seed's difference falls inside
RERUN bands, in either column, runs again under a second seed and is judged on its mean
(`needs_second_seed`): one seed is not enough to tell a small effect from noise.
"""

from __future__ import annotations

import statistics

BANDS = 2.0  # standard deviations of the base row's seeds
RERUN = 2.0  # bands: a difference inside this many runs again under a second seed
# column -> (our measured key, the paper's key, the paper's "equal to base" threshold)
COLUMNS = {"ppl": ("dev_ppl", "dev_ppl", 0.02), "bleu": ("tok_bleu", "dev_bleu", 0.1)}
CLASSES = ("agrees", "within noise", "disagrees")


def band(base_values: list[float]) -> float | None:
    """BANDS standard deviations of the base row's seeds (None with fewer than 2)."""
    if len(base_values) < 2:
        return None
    return BANDS * statistics.stdev(base_values)


def classify(difference: float, paper_difference: float, width: float, equal: float) -> str:
    """One of CLASSES for a row's `difference` from base against the band `width`; `equal`:
    the paper's difference at or under which it reports the row as equal to base."""
    inside = abs(difference) <= width
    if abs(paper_difference) <= equal:
        return "agrees" if inside else "disagrees"
    if inside:
        return "within noise"
    return "agrees" if (difference > 0) == (paper_difference > 0) else "disagrees"


def needs_second_seed(difference: float, width: float) -> bool:
    return abs(difference) <= RERUN * width


def judge(rows: dict[str, dict], paper: dict[str, dict], base: str = "base") -> dict:
    """`rows`: row name -> column key -> the values of its seeds (our measured keys, e.g.
    {"dev_ppl": [5.1, 5.2], "tok_bleu": [20.3, 20.1]}); `paper`: row name -> the paper's
    figures (dev_ppl, dev_bleu). Returns {"band": {column: width}, "rows": {name: {column:
    {"mean", "difference", "paper_difference", "class", "second_seed"}}}} for every row
    measured beside a base with at least 2 seeds."""
    out = {"band": {}, "rows": {}}
    for column, (ours, theirs, equal) in COLUMNS.items():
        base_values = rows.get(base, {}).get(ours, [])
        width = band(base_values)
        out["band"][column] = width
        if width is None:
            continue
        base_mean = statistics.fmean(base_values)
        for name, values in rows.items():
            got, p_row, p_base = values.get(ours), paper[name].get(theirs), paper[base][theirs]
            if name == base or not got or p_row is None:
                continue
            difference = statistics.fmean(got) - base_mean
            first = got[0] - base_mean
            out["rows"].setdefault(name, {})[column] = {
                "mean": statistics.fmean(got),
                "seeds": len(got),
                "difference": difference,
                "paper_difference": p_row - p_base,
                "class": classify(difference, p_row - p_base, width, equal),
                "second_seed": needs_second_seed(first, width),
            }
    return out
